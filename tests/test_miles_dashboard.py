"""``python -m trainer_hooks.miles.dashboard``, the launcher of Miles' dashboard on our dumps, as a
real child process serving Miles' FastAPI app under uvicorn: it listens on loopback unless
``--host`` widens it (a run's dumps hold prompts, responses and screenshots), and refuses a
directory that is not in the ``--dump-details`` layout in one line instead of serving an empty
dashboard. The reader itself and serving a dump over HTTP: test_miles_dumps.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.miles_snapshot import require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch
pytest.importorskip(
    "polars", reason="Miles' dashboard reader needs polars (pip install 'rollout-bundles[dashboard]')"
)
pytest.importorskip(
    "uvicorn", reason="serving Miles' dashboard needs uvicorn (pip install 'rollout-bundles[dashboard]')"
)
pytest.importorskip(
    "fastapi", reason="serving Miles' dashboard needs fastapi (pip install 'rollout-bundles[dashboard]')"
)

from miles.utils.types import Sample  # noqa: E402

from trainer_hooks import save_debug_rollout_data, store_media  # noqa: E402
from trainer_hooks.testing import png_bytes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def write_dump(tmp_path: Path, template: str, rollout_id: int = 3) -> Path:
    """A debug dump of three samples with a screenshot each, at ``template`` formatted with the id."""
    args = Namespace(
        save_debug_rollout_data=template, shared_media_dir=str(tmp_path / "media"), run_uuid="run-1"
    )
    samples = [
        Sample(
            group_index=0,
            index=i,
            prompt=f"open settings {i}",
            tokens=[5, 6, 7 + i],
            multimodal_inputs={"images": [str(store_media(args, png_bytes(8, 8, (i, 2, 3))).path)]},
            response="click",
            response_length=1,
            loss_mask=[1],
            reward=float(i),
            status=Sample.Status.COMPLETED,
        )
        for i in range(3)
    ]
    path = save_debug_rollout_data(args, samples, rollout_id, False)
    old = time.time() - 3600  # a finished dump: older than Miles' reader's MIN_AGE_SECONDS
    os.utime(path, (old, old))
    return Path(path)


def launcher(*argv: str) -> list[str]:
    return [sys.executable, "-m", "trainer_hooks.miles.dashboard", *argv]


ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(MILES)])}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_address() -> str | None:
    """One IPv4 address of this machine that is not loopback, or None (no route: nothing to test)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel picks the source
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def serve(dump_dir: Path, tmp_path: Path, *extra: str) -> tuple[str, int]:
    """Run the launcher until it answers ``/api/meta`` on ``host`` (``--host`` in ``extra``, else
    127.0.0.1); return its output (terminated) and the port."""
    port = free_port()
    host = extra[extra.index("--host") + 1] if "--host" in extra else "127.0.0.1"
    proc = subprocess.Popen(
        launcher("--dump-details", str(dump_dir), "--port", str(port), "--cache-dir", str(tmp_path / "cache"), *extra),
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/api/meta", timeout=10) as r:
                    meta = json.loads(r.read())
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the dashboard did not come up:\n{proc.communicate(timeout=5)[0][-3000:]}"
                    ) from None
                time.sleep(0.2)
        assert meta["rollout_ids"]["train"] == [3]
        if host.startswith("127.") and (address := non_loopback_address()) is not None:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=5):
                pass  # not reachable from the network
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    return out, port


def test_the_dashboard_launcher_listens_on_loopback_unless_host_widens_it(tmp_path):
    """Miles' own launcher binds 0.0.0.0; ours binds 127.0.0.1 by default (not reachable on the
    machine's network address), and an explicit ``--host`` is honoured."""
    write_dump(tmp_path, f"{tmp_path}/details/rollout_data/{{rollout_id}}.pt")
    out, port = serve(tmp_path / "details", tmp_path)
    assert f"Uvicorn running on http://127.0.0.1:{port}" in out, out[-3000:]
    out, port = serve(tmp_path / "details", tmp_path, "--host", "127.0.0.2")
    assert f"Uvicorn running on http://127.0.0.2:{port}" in out, out[-3000:]


@pytest.mark.parametrize("layout", ["flat", "bundle-suffix", "empty", "missing"])
def test_the_dashboard_launcher_refuses_another_layout_in_one_line(tmp_path, layout):
    """Pointed at bundles in another layout (Miles' reader would show an empty dashboard with no
    hint), the launcher exits 2 with one line naming what it expected and what it found."""
    root = tmp_path / "dumps"
    found = {
        "flat": "found no rollout_data/ but 2 bundle(s) in another layout: steps/3.pt/, steps/4.pt/",
        "bundle-suffix": "found rollout_data/ holding only rollout_data/3.bundle/",
        "empty": "found an empty directory",
        "missing": f"found nothing at {root}",
    }[layout]
    if layout == "flat":  # --save-debug-rollout-data DIR/steps/{rollout_id}.pt
        write_dump(tmp_path, f"{root}/steps/{{rollout_id}}.pt", 3)
        write_dump(tmp_path, f"{root}/steps/{{rollout_id}}.pt", 4)
    elif layout == "bundle-suffix":  # log_rollout_bundle's output without Miles' own pickles
        write_dump(tmp_path, f"{root}/rollout_data/{{rollout_id}}.bundle")
    elif layout == "empty":
        root.mkdir()
    r = subprocess.run(
        launcher("--dump-details", str(root), "--port", str(free_port())),
        env=ENV, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == (
        f"trainer_hooks.miles.dashboard: --dump-details {root}: expected {root}/rollout_data/<id>.pt "
        "(the --dump-details layout, as --save-debug-rollout-data DIR/rollout_data/{rollout_id}.pt writes it), "
        f"{found}\n"
    )


def test_the_dashboard_launcher_help_is_its_own(tmp_path):
    """``--help`` says what the launcher is (bundles, the dump layout, 127.0.0.1 by default), then
    lists Miles' options it passes through; not Miles' text, whose ``--host`` is 0.0.0.0
    (issue 30, item 20)."""
    r = subprocess.run(
        launcher("--help"), env=ENV, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    out = r.stdout
    assert out.startswith("usage: python -m trainer_hooks.miles.dashboard --dump-details DIR"), out[:300]
    assert "bundles" in out and "rollout_data/<id>.pt" in out and "save_debug_rollout_data" in out
    assert "--host ADDR         address to listen on (default: 127.0.0.1, this machine" in out
    assert "Standalone dashboard server" not in out  # Miles' description
    miles = out.split("Miles' dashboard options (passed to miles.dashboard.serve unchanged):\n", 1)[1]
    assert "--port PORT" in miles and "--follow" in miles and "--cache-dir" in miles
    assert "--host" not in miles and "--dump-details" not in miles and "--help" not in miles
