"""``make demo`` runs in CI: ``examples/demo.py`` is the first thing a newcomer runs, and it broke
once without any test noticing (the resumed run's dataset was refused by the resume fingerprint).

It runs as a real subprocess, exactly as ``make demo`` starts it, with ``--out`` in a temporary
directory; the tests check its exit status, its last line, the files it says it wrote, that it
reads as a walk-through (issue 24), and that README.md quotes what it prints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.processor, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


README = DEMO.parents[1] / "README.md"
HEADING = re.compile(r"\[\d+/\d+\] \S")
FOOTERS = ("demo OK in ", "open the report of the last debug dump: ", "kept the demo's directory ")
JSON_LINE = re.compile(r'^\s*([{}\[\]],?|"[^"]*": .*)$')  # a line of an indented JSON dump
MAX_JSON_LINES = 3


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One run of the demo for the module, from a working directory of its own with the default
    relative ``--out`` (as ``make demo`` runs it from the repository)."""
    cwd = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--out", "demo-out"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"demo exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc, cwd


def test_make_demo_plays_a_whole_run_and_writes_its_report(demo):
    proc, cwd = demo
    out = cwd / "demo-out"
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("demo OK in") for line in lines), proc.stdout[-2000:]
    assert "[6/6]" in proc.stdout and "Traceback" not in proc.stderr
    page = cwd / lines[-1].rsplit(": ", 1)[1]  # "open the report of the last debug dump: <page>"
    reports = sorted(out.glob("*.replay.json"))
    assert page.is_file() and page.parent == out and reports, sorted(p.name for p in out.iterdir())
    summary = json.loads(reports[-1].read_text())["summary"]
    assert summary["samples"] == 2 and summary["images"] == 6 and summary["problems"] == {}
    html = page.read_text()
    assert "Content-Security-Policy" in html and "<script" not in html.split("</head>")[1]
    # What the view line says it wrote is what it wrote: the page and its search page.
    view_line = next(line for line in lines if "rollout-bundle view:" in line)
    assert "one file" not in view_line and "1 samples" not in proc.stdout
    assert sorted(p.name for p in out.glob("*.html")) == ["rollout_2.html", "rollout_2.search.html"]
    assert "rollout_2.search.html" in view_line


def test_demo_reads_as_a_walk_through(demo):
    """Each step's lines indented under its heading (log records too: nothing on stderr), no raw
    temporary path, and no JSON dump of more than a few lines."""
    proc, _ = demo
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert HEADING.match(lines[0]), lines[0]
    stray = [
        line
        for line in lines
        if not (HEADING.match(line) or line.startswith(FOOTERS) or line.startswith("  "))
    ]
    assert stray == [], stray
    # The commands it prints name this interpreter's own executables (``.venv/bin/...`` under
    # `make demo`; here, wherever the test's interpreter lives, which may be under /tmp): not a
    # temporary path of the demo's.
    text = proc.stdout.replace(str(Path(sys.executable).parent) + os.sep, "<bin>/")
    assert "/tmp/" not in text and tempfile.gettempdir() + os.sep not in text
    assert "rollout-bundles-demo-" not in proc.stdout and ".unpacked" not in proc.stdout.replace(
        "….unpacked", ""
    )
    run = longest = 0
    for line in lines:
        run = run + 1 if JSON_LINE.match(line) else 0
        longest = max(longest, run)
    assert longest <= MAX_JSON_LINES, f"a JSON dump of {longest} lines"


def _as_make_demo(line: str) -> str:
    """A line as ``make demo`` prints it: the commands name ``.venv/bin/`` (this interpreter's
    directory here: a tox env's, or a venv outside the working directory)."""
    line = line.replace(sys.executable, ".venv/bin/python")
    return line.replace(os.path.dirname(sys.executable) + os.sep, ".venv/bin/")


def _masked(line: str) -> str:
    """A line of output with what changes between runs (numbers, uuids, pids) masked."""
    line = re.sub(r"\b[0-9a-f]{8}…", "UUID…", _as_make_demo(line))
    return re.sub(r"\d+(\.\d+)?", "N", line)


def _readme_excerpt() -> list[str]:
    text = README.read_text()
    section = text[text.index("### What `make demo` shows") :]
    return section.split("```\n", 2)[1].splitlines()


def test_the_readme_excerpt_is_what_the_demo_prints(demo):
    proc, _ = demo
    printed = {_masked(line) for line in proc.stdout.splitlines()}
    missing = [line for line in _readme_excerpt() if _masked(line) not in printed]
    assert missing == [], missing


def test_the_readme_figures_for_save_agree_with_the_demo(demo):
    """README: the caller of save() waits for the snapshot ("about a millisecond for the demo's 6
    samples") and one fsync of the rollout journal ("from about one to tens of milliseconds");
    the demo prints both, measured."""
    proc, _ = demo
    readme = " ".join(README.read_text().split())
    assert "about a millisecond for the demo's 6 samples" in readme
    assert "in the demo from about one to tens of milliseconds" in readme
    line = next(line for line in proc.stdout.splitlines() if "save() blocked the caller" in line)
    m = re.search(
        r"caller ([\d., ]+) ms \((\d+) saves\): the snapshot of the groups ([\d.]+) ms at most", line
    )
    assert m, line
    calls = [float(x) for x in m[1].split(", ")]
    snapshot = float(m[3])
    assert len(calls) == int(m[2]) == 3
    assert 0.0 < snapshot <= 10.0, line  # "about a millisecond": within an order of magnitude
    assert snapshot <= max(calls) < 1000.0, line  # "tens of milliseconds", with room for a slow disk
    assert "the rest waiting for the rollout journal's fsync" in line
    # Each checkpoint's own record of the split is what the inspect step prints.
    assert re.search(
        r"^    save +blocked [\d.]+ ms, of which the journal's fsync [\d.]+ ms$", proc.stdout, re.M
    )


def test_the_demo_leaves_a_dump_that_miles_dashboard_serves(demo):
    """Step 6 leaves the colleague's dump in Miles' ``--dump-details`` layout, and the command it
    prints serves it: ``python -m trainer_hooks.miles.dashboard`` (with a Miles checkout) lists
    rollout 2 over HTTP on 127.0.0.1 (issue 30, item 20: the demo wrote no dump it could serve)."""
    proc, cwd = demo
    from bundles import open_bundle

    dump = cwd / "demo-out" / "dump-details" / "rollout_data" / "2.pt"
    assert len(open_bundle(dump, verify="full")) == 2
    line = next(
        line for line in proc.stdout.splitlines() if "python -m trainer_hooks.miles.dashboard" in line
    )
    command = line.split()
    assert command[:3] == [sys.executable, "-m", "trainer_hooks.miles.dashboard"], line
    from helpers.miles_snapshot import MILES_ROOT, miles_missing

    if (reason := miles_missing()) is not None:
        pytest.skip(reason)
    for dep in ("polars", "fastapi", "uvicorn", "torch"):
        if importlib.util.find_spec(dep) is None:
            pytest.skip(f"Miles' dashboard needs {dep} (pip install 'rollout-bundles[dashboard]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DEMO.parents[1]), str(MILES_ROOT)])}
    server = subprocess.Popen(
        [sys.executable, *command[1:], "--port", str(port), "--cache-dir", str(cwd / "dashboard-cache")],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # Miles' reader lists a dump once it is 10 s old (a live run may still be writing it).
        deadline = time.monotonic() + 90
        ids = None
        while ids != [2]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/meta", timeout=10) as r:
                    ids = json.loads(r.read())["rollout_ids"]["train"]
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"no rollout 2 served (last: {ids}):\n{server.communicate(timeout=5)[0][-3000:]}"
                )
            if ids != [2]:
                time.sleep(0.5)
    finally:
        server.terminate()
        server.communicate(timeout=10)


def test_commands_on_the_temporary_directory_say_how_to_keep_it(demo):
    """The demo prints ``rollout-bundle`` commands on ``$DEMO``, which it removes at exit: where it
    does, it says that ``--keep`` keeps it (issue 30, item 21), and ``--keep`` is in its help."""
    proc, _ = demo
    lines = proc.stdout.splitlines()
    on_demo = [i for i, line in enumerate(lines) if "rollout-bundle " in line and "$DEMO" in line]
    assert on_demo, "the demo prints no command on $DEMO any more: drop this test"
    note = "$DEMO is removed when the demo ends; make demo DEMO_ARGS=--keep keeps it for such commands"
    for i in on_demo:  # the note follows within the step
        step_end = next((j for j in range(i + 1, len(lines)) if HEADING.match(lines[j])), len(lines))
        assert any(note in line for line in lines[i:step_end]), lines[i]
    helped = subprocess.run([sys.executable, str(DEMO), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--keep" in helped.stdout and "$DEMO" in helped.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_make_demo_installs_what_the_demo_tells_to_run() -> None:
    """The demo ends suggesting ``rollout-bundle serve``: ``make demo``'s venv has the serve
    extra (it had not: the command failed with "needs starlette"; issue 36, item 19)."""
    makefile = (DEMO.parents[1] / "Makefile").read_text()
    extras = re.search(r"^DEV_EXTRAS := (.*)$", makefile, re.M)
    assert extras and "serve" in extras[1].split(","), extras
    assert "-e '.[$(DEV_EXTRAS)]'" in makefile


def test_with_keep_the_printed_commands_run_as_printed(tmp_path: Path) -> None:
    """``--keep``: the output names the kept directory by its path (not ``$DEMO``), the commands
    name this interpreter's executables (``.venv/bin/rollout-bundle`` under ``make demo``, not on
    PATH), and they run as printed: ``inspect`` on the checkpoint, and ``serve`` on the run, which
    still holds a debug dump to browse (issue 36, item 19)."""
    import shlex
    import shutil

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--out", "demo-out", "--keep"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kept = Path(proc.stdout.split("kept the demo's directory (the commands above run on it): ")[1].split()[0])
    try:
        assert kept.is_dir() and "$DEMO" not in proc.stdout
        bindir = os.path.dirname(sys.executable)
        lines = [line.strip() for line in proc.stdout.splitlines()]
        inspect = next(line for line in lines if line.startswith("the rest (") and " inspect " in line)
        argv = shlex.split(inspect.split(": ", 1)[1])
        assert argv[0] == os.path.join(bindir, "rollout-bundle"), inspect
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0 and "rollout_checkpoint" in done.stdout, done.stderr
        serve = shlex.split(
            next(line for line in lines if line.startswith(f"{bindir}/rollout-bundle serve "))
        )
        run = Path(serve[-1])
        assert run == kept / "run1", serve
        listed = subprocess.run(
            [*serve[:-2], "ls", "-r", str(run)], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        dumps = [p for p in listed.stdout.splitlines() if "/debug/rollout_" in p]
        assert listed.returncode == 0 and dumps, listed.stdout + listed.stderr
        port = _free_port()
        server = subprocess.Popen(
            [*serve, "--port", str(port), "--cache-dir", str(tmp_path / "serve-cache"), "--no-progress"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            page = ""
            while "rollout_2" not in page:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
                        page = r.read().decode()
                except OSError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"serve did not list the dump:\n{server.communicate(timeout=5)[0][-3000:]}"
                    )
                if "rollout_2" not in page:
                    time.sleep(0.5)
        finally:
            server.terminate()
            server.communicate(timeout=10)
    finally:
        shutil.rmtree(kept, ignore_errors=True)
