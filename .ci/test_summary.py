#!/usr/bin/env python3
"""Print one line per tox env from the JUnit XML files pytest wrote: passed, failed, skipped.

``make test`` runs this after tox, whatever tox's exit status, so the counts are the last thing
on the screen. Usage: ``test_summary.py DIR`` (tox.ini writes ``{work_dir}/junit/<env>.xml``).
Exit status 0 unless DIR holds no report at all. Standard library only.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    reports = sorted(Path(argv[1]).glob("*.xml"))
    if not reports:
        print(f"test summary: no JUnit reports under {argv[1]} (did any tox env run pytest?)")
        return 1
    rows = [("ENV", "PASSED", "FAILED", "ERRORS", "SKIPPED", "TIME")]
    for path in reports:
        try:
            c = counts(path)
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
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("test summary (per tox env):")
    for r in rows:
        print(
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
