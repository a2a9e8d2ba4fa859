"""Prepare the mutation run of the safety core (``make mutants-safety``; docs/TESTING.md).

mutmut 3.8.1 reads its configuration only from ``pyproject.toml`` and takes no option to narrow
which files it mutates or which tests its stats run runs. So this script copies the files git
knows (tracked, and untracked ones that are not ignored: a test being written counts) into a
scratch tree (``build/mutants-safety`` by default), and rewrites ``[tool.mutmut]`` *there* so that
``only_mutate`` names the modules of :data:`MODULES` and the test selection is :data:`TESTS`. The
``[tool.mutmut]`` of the project itself, and so plain ``make mutants``, is left as it is.

A file is copied only when its bytes differ from the scratch copy (keeping the source's mtime):
mutmut regenerates a module's mutants when the source is newer than its mutated copy, and keeps
its cached verdicts otherwise, so a rerun after adding a test retests only what changed. Files
git no longer knows are removed from the scratch tree (not from its ``mutants/``: delete the
scratch tree after a large refactor, as for ``make mutants``).

Prints the scratch directory. The Makefile then runs ``mutmut run`` in it.

``--try NAME... --tests TEST...`` checks new tests against mutants of the last run without a
mutmut run (whose stats run alone takes minutes): it copies ``tests/`` into the run's
``mutants/``, runs the tests once with no mutant (they must pass), then once per mutant with
``MUTANT_UNDER_TEST`` set, as mutmut's workers do, and says which are killed. ``NAME`` may be a
glob (``"bundles._store.write.x__media_listed*"``). It reads the mutated modules as they are:
run it on a tree whose sources match the last ``make mutants-safety``.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: The bundle proof, the deletion primitive and the publish path (issue 36, "Checks").
MODULES = [
    "bundles/_local/proof.py",
    "bundles/_store/pointer.py",
    "bundles/_local/commit.py",
    "bundles/_store/write.py",
    "bundles/_store/verify.py",
]

#: The test files that exercise them in-process (mutmut picks a mutant's tests by in-process
#: coverage, so a test that reaches a module only through a subprocess adds nothing but time).
TESTS = [
    "tests/test_bundle_proof.py",
    "tests/test_store_publish.py",
    "tests/test_bundle_commit.py",
    "tests/test_store_ownership.py",
    "tests/test_location_safety.py",
    "tests/test_store_bundles.py",
    "tests/test_store_gc.py",
    "tests/test_store_faults.py",
    "tests/test_write_failures.py",
    "tests/test_mutants_safety.py",
]

#: The SeaweedFS twins of the moto cases of these two files cover the same code a second time.
DESELECT = "not (test_store_bundles and seaweedfs) and not (test_store_gc and seaweedfs)"

_ARRAY = r"(?ms)^{key} = \[.*?^\]\n"


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    return sorted({name for name in out.decode().split("\0") if name and (root / name).is_file()})


def sync(root: Path, dest: Path) -> None:
    """Make ``dest`` hold the files git knows under ``root``, copying only what differs."""
    names = tracked_files(root)
    for name in names:
        src, dst = root / name, dest / name
        if dst.is_file() and not dst.is_symlink() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        shutil.copy2(src, dst)
    known = set(names)
    for dirpath, dirnames, filenames in os.walk(dest):
        rel = Path(dirpath).relative_to(dest)
        dirnames[:] = [d for d in dirnames if not (rel == Path(".") and d in ("mutants", ".venv", ".git"))]
        for f in filenames:
            if (rel / f).as_posix() not in known:
                (Path(dirpath) / f).unlink()


def _toml_list(values: list[str]) -> str:
    return "[\n" + "".join(f'    "{v}",\n' for v in values) + "]\n"


def narrow(pyproject: Path, modules: list[str], tests: list[str]) -> None:
    """Rewrite ``[tool.mutmut]`` in ``pyproject`` (the scratch copy): mutate ``modules`` only, run
    ``tests`` only (still without Ray, and without the deselected SeaweedFS twins)."""
    import tomllib  # Python 3.11+, as the Makefile's venv (mutmut reads the file with it too)

    text = pyproject.read_text()
    before = tomllib.loads(text)["tool"]["mutmut"]
    selection = [*tests, "-m", "not ray", "-k", DESELECT]
    for key, values in (("only_mutate", modules), ("pytest_add_cli_args_test_selection", selection)):
        text, n = re.subn(_ARRAY.format(key=key), f"{key} = {_toml_list(values)}".replace("\\", "\\\\"), text)
        if n != 1:
            sys.exit(f"mutants_safety: {pyproject}: expected one `{key} = [...]` array, found {n}")
    after = tomllib.loads(text)["tool"]["mutmut"]
    assert after["only_mutate"] == modules and after["pytest_add_cli_args_test_selection"] == selection
    assert {
        k: v for k, v in after.items() if k not in ("only_mutate", "pytest_add_cli_args_test_selection")
    } == {k: v for k, v in before.items() if k not in ("only_mutate", "pytest_add_cli_args_test_selection")}
    pyproject.write_text(text)


def report(dest: Path) -> str:
    """The score per module of the run in ``dest``, from ``mutmut results --all true``: a
    markdown table (mutants, checked, killed, survived, score = killed / checked) and the
    survivors' names. A timeout counts as checked and not killed, and so does a survivor of
    ``--try --record`` that mutmut has not run; "no tests" and "not checked" as unchecked."""
    out = subprocess.run(
        [str(dest / ".venv" / "bin" / "mutmut"), "results", "--all", "true"],
        cwd=dest,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    survivors = []
    tried = dest / "mutants" / "try-survived.txt"
    survived_try = set(tried.read_text().split()) if tried.is_file() else set()
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if status == "not checked" and name in survived_try:
            status = "survived (--try)"  # checked by --try only: counted, as not killed
        module = re.split(r"\.x[_\u01c1]", name, maxsplit=1)[0].replace(".", "/") + ".py"
        if not sep or module not in rows:
            continue
        rows[module][status] = rows[module].get(status, 0) + 1
        if status not in ("killed", "not checked", "no tests"):
            survivors.append(f"{name}: {status}")
    lines = ["| module | mutants | checked | killed | survived | score |", "|---|---:|---:|---:|---:|---:|"]
    total = [0, 0, 0, 0]
    for module, counts in rows.items():
        n = sum(counts.values())
        checked = n - counts.get("not checked", 0) - counts.get("no tests", 0)
        killed = counts.get("killed", 0)
        row = (n, checked, killed, checked - killed)
        total = [a + b for a, b in zip(total, row, strict=True)]
        lines.append(_row(f"`{module}`", *row))
    lines.append(_row("**together**", *total))
    return "\n".join([*lines, "", *survivors])


def _row(what: str, n: int, checked: int, killed: int, survived: int) -> str:
    score = f"{100 * killed / checked:.0f} %" if checked else "-"
    return f"| {what} | {n:,} | {checked:,} | {killed:,} | {survived:,} | {score} |"


def mutant_names(dest: Path, patterns: list[str], killed: bool = True) -> list[str]:
    """The mutants of the last run in ``dest`` matching ``patterns`` (globs), in file order;
    without ``killed``, less those it killed."""
    import fnmatch
    import json

    names = []
    for module in MODULES:
        meta = dest / "mutants" / f"{module}.meta"
        if meta.is_file():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            names += [n for n, code in codes.items() if killed or code not in (1, 3)]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _forked(mutant: str, args: list[str], limit_s: float) -> int | None:
    """Run pytest with ``args`` in a child forked from this process (tests collected already),
    with ``mutant`` active; its exit status, or None when it ran past ``limit_s``."""
    import time

    import pytest

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.environ["MUTANT_UNDER_TEST"] = mutant
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os._exit(int(pytest.main(args)))
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _record_kill(dest: Path, name: str) -> None:
    """Mark ``name`` killed (exit code 1) in mutmut's cache of the run in ``dest``. Kills only:
    a survivor of ``--try`` may still be killed by the rest of the selection, which mutmut runs."""
    import json

    for module in MODULES:
        meta = dest / "mutants" / f"{module}.meta"
        if meta.is_file():
            data = json.loads(meta.read_text())
            if name in data["exit_code_by_key"]:
                data["exit_code_by_key"][name] = 1
                meta.write_text(json.dumps(data, indent=4))
                return


def try_mutants(root: Path, dest: Path, patterns: list[str], tests: list[str], record: bool) -> int:
    """See the module docstring (``--try``). Returns 1 when a mutant survives."""
    import pytest

    shutil.copytree(root / "tests", dest / "mutants" / "tests", dirs_exist_ok=True)
    os.chdir(dest / "mutants")
    sys.path[:0] = [str(dest / "mutants"), str(dest / "mutants" / "tests")]
    os.environ.update(PYTHONPATH=str(dest / "mutants"), HYPOTHESIS_PROFILE="mutants")
    args = ["-x", "-q", "-p", "no:cacheprovider", *tests]
    pytest.main(["--collect-only", "-q", *args])  # imports the tests once, before any fork
    if _forked("", args, 600) != 0:
        sys.exit(f"mutants_safety: {' '.join(tests)} fail without a mutant")
    tried = dest / "mutants" / "try-survived.txt"  # the survivors of --record runs: not tried again by one
    skip = set(tried.read_text().split()) if record and tried.is_file() else set()
    survived = 0
    for name in mutant_names(dest, patterns, killed=not record):
        if name in skip:
            continue
        code = _forked(name, args, 120)
        verdict = "timeout" if code is None else "survived" if code == 0 else "killed"
        print(f"{name}: {verdict}", flush=True)
        if verdict == "killed":
            if record:
                _record_kill(dest, name)
            continue
        survived += 1
        if record:
            with open(tried, "a") as f:
                f.write(name + "\n")
    return 1 if survived else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dest", default="build/mutants-safety", help="the scratch tree (default: %(default)s)"
    )
    parser.add_argument("--report", action="store_true", help="print the score per module of the last run")
    parser.add_argument("--try", dest="patterns", nargs="+", metavar="NAME", help="mutants to try --tests on")
    parser.add_argument("--record", action="store_true", help="--try: record its kills in mutmut's cache")
    parser.add_argument("--tests", nargs=argparse.REMAINDER, default=[], help="pytest arguments for --try")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    dest = (root / args.dest).resolve()
    if args.report:
        print(report(dest))
        return 0
    if args.patterns:
        return try_mutants(root, dest, args.patterns, args.tests, args.record)
    dest.mkdir(parents=True, exist_ok=True)
    sync(root, dest)
    missing = [t for t in TESTS if not (root / t).is_file()]
    if missing:  # the selection must stay fixed: mutmut drops every cached verdict when it changes
        sys.exit(f"mutants_safety: no {', '.join(missing)}: update TESTS")
    narrow(dest / "pyproject.toml", MODULES, TESTS)
    venv = dest / ".venv"
    if not venv.exists():
        venv.symlink_to((root / ".venv").resolve())
    (dest / "mutants").mkdir(exist_ok=True)
    print(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
