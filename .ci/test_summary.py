#!/usr/bin/env python3
"""Print one line per tox env from the JUnit XML files pytest wrote: passed, failed, skipped;
then one line per env and skip reason: how many tests were skipped, and why; then, last, every
test that failed or errored, with the first line of its message.

``make test`` runs this after tox, whatever tox's exit status, so the counts are the last thing
on the screen, and the failures the very last (a CI system that keeps only the tail of the log
still shows which test failed and why). Usage: ``test_summary.py DIR`` (tox.ini writes ``{work_dir}/junit/<env>.xml``).
Exit status 0 unless DIR holds no report at all. Standard library only.

Skip reasons come from each ``<skipped>`` element: its ``message`` for a skipped test, the reason
inside the text for a module skipped at collection (pytest writes ``message="collection
skipped"`` and the ``(path, line, 'Skipped: reason')`` tuple as text), ``xfail: <reason>`` for an
expected failure (JUnit counts those as skipped too).
"""

from __future__ import annotations

import ast
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def counts(path: Path) -> dict[str, float]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0.0, "failures": 0.0, "errors": 0.0, "skipped": 0.0, "time": 0.0}
    for s in suites:
        for k in total:
            total[k] += float(s.get(k, 0) or 0)
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def skip_reason(skipped: ET.Element) -> str:
    """Why one ``<skipped>`` element was skipped, in one line."""
    message = skipped.get("message") or ""
    if skipped.get("type") == "pytest.xfail":
        return f"xfail: {message}" if message else "xfail"
    if message == "collection skipped":
        try:
            where = ast.literal_eval((skipped.text or "").strip())
            message = str(where[2])
        except (ValueError, SyntaxError, TypeError, IndexError):
            message = (skipped.text or "").strip()
        message = message.removeprefix("Skipped: ")
    return " ".join(message.split()) or "(no reason given)"


def skip_reasons(path: Path) -> Counter[str]:
    """How many tests of one report were skipped for each reason."""
    return Counter(skip_reason(s) for s in ET.parse(path).getroot().iter("skipped"))


def failures(path: Path) -> list[str]:
    """``module.Class::test: first line of the message`` (JUnit's classname and name) for each
    test of one report that failed or errored, at most 300 characters a line."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            name = f"{case.get('classname') or '?'}::{case.get('name') or '?'}"
            lines = (bad.get("message") or bad.text or "").strip().splitlines()
            first = " ".join(lines[0].split()) if lines else "(no message)"
            kind = "error" if bad.tag == "error" else "failed"
            out.append(f"{kind} {name}: {first}"[:300])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    reports = sorted(Path(argv[1]).glob("*.xml"))
    if not reports:
        print(f"test summary: no JUnit reports under {argv[1]} (did any tox env run pytest?)")
        return 1
    rows = [("ENV", "PASSED", "FAILED", "ERRORS", "SKIPPED", "TIME")]
    skips: list[str] = []
    failed: list[str] = []
    for path in reports:
        try:
            c = counts(path)
            reasons = skip_reasons(path)
            failed += [f"  {path.stem}: {f}" for f in failures(path)]
        except (ET.ParseError, OSError) as e:
            rows.append((path.stem, "-", "-", "-", "-", f"unreadable: {e}"))
            continue
        rows.append(
            (
                path.stem,
                str(int(c["passed"])),
                str(int(c["failures"])),
                str(int(c["errors"])),
                str(int(c["skipped"])),
                f"{c['time']:.0f}s",
            )
        )
        for reason, n in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
            skips.append(f"  {path.stem}: {n} skipped: {reason}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("test summary (per tox env):")
    for r in rows:
        print(
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    if skips:
        print("skipped, by reason:")
        print("\n".join(skips))
    if failed:
        print("failed:")
        print("\n".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
