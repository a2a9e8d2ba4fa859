"""``rollout-bundle view`` on bundles from strangers (issue 16): no code run, no document linked,
no traceback, one read per stored file, a page even when a screenshot is gone."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import put_media

from bundles import BundleError, MediaRef, pack_bundle, write_bundle
from trainer_hooks.cli import main
from trainer_hooks.view import write_html_report

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("jinja2", reason="view needs the [view] extra (jinja2)")

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "tests" / "vectors" / "hostile" / "view"
TABLE: dict[str, dict] = json.loads((VECTORS / "expected.json").read_text())
_spec = importlib.util.spec_from_file_location("generate_view", VECTORS.parent / "generate_view.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


def png(w: int = 64, h: int = 36, color: tuple[int, int, int] = (40, 90, 160)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), color).save(out, "PNG")
    return out.getvalue()


def test_the_view_table_matches_its_generator() -> None:
    on_disk = {p.name for p in VECTORS.iterdir()} - {"expected.json"}
    wanted = {row["path"] for row in TABLE.values()} | {
        row["replay"] for row in TABLE.values() if row["replay"]
    }
    assert on_disk == wanted
    assert generator.table() == TABLE  # regenerate: python tests/vectors/hostile/generate_view.py


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_hostile_view_vector_gives_a_page_and_named_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    row = TABLE[name]
    bundle = tmp_path / row["path"]
    shutil.copytree(VECTORS / row["path"], bundle)  # a copy: links are checked relative to the page
    out = tmp_path / "page.html"
    args = ["view", str(bundle), "-o", str(out)]
    if row["replay"]:
        args += ["--replay", str(VECTORS / row["replay"])]
    assert main(args) == 0
    captured = capsys.readouterr()
    text = out.read_text()
    warning = [line for line in captured.err.splitlines() if "warning" in line]
    for fragment in row["not_shown"]:
        assert warning and fragment in warning[0], (fragment, captured.err)
        assert fragment.split(" (")[0] in text or "cannot be shown" in captured.err
    if not row["not_shown"]:
        assert captured.err == ""
    for fragment in row["present"]:
        assert fragment in text, fragment
    for fragment in row["absent"]:
        assert fragment not in text, fragment
    assert "<script" not in text.lower()
    # Every link on the page is to a stored raster image that exists next to it.
    for href in re.findall(r'<a [^>]*href="([^"#][^"]*)"', text):
        if href == "page.search.html":  # the report's own search page, written beside it
            continue
        assert href.lower().endswith((".png", ".jpg", ".jpeg")), href
        assert (out.parent / href).is_file(), href


def test_an_eps_stored_as_png_never_reaches_ghostscript(tmp_path: Path) -> None:
    """A `gs` stand-in first on PATH leaves a mark when anything runs it (Pillow's EPS plugin does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "gs-ran"
    gs = bin_dir / "gs"
    gs.write_text(f'#!/bin/sh\ntouch {mark}\n[ "$1" = --version ] && echo 10.02.1 && exit 0\nexit 1\n')
    gs.chmod(gs.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "page.html"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "view", str(VECTORS / "view-eps-as-png"), "-o", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert not mark.exists(), "Ghostscript ran on a file from the bundle"
    assert proc.returncode == 0, proc.stderr
    assert "not a PNG or JPEG image" in proc.stderr and "not a PNG or JPEG image" in out.read_text()


def test_a_corrupt_screenshot_is_one_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    bad = [MediaRef.from_file(put_media(run, png()[:50] + bytes([k]) * 40)) for k in range(5)]
    good = MediaRef.from_file(put_media(run, png()))
    b = write_bundle(tmp_path / "b", [{"multimodal_inputs": {"images": [good, *bad]}}], media_roots=[run])
    assert main(["view", str(b), "-o", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "rollout-bundle view: warning: 5 stored screenshot(s) cannot be shown"
    )
    assert f"media/{bad[0].filename}: cannot decode as PNG" in err and err.rstrip().endswith("; ...")


def test_output_directory_is_never_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = write_bundle(tmp_path / "b", [{"x": 1}])
    target = tmp_path / "no" / "such" / "r.html"
    assert main(["view", str(b), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"rollout-bundle view: error: -o {target}: directory {target.parent} does not exist\n"
    assert not (tmp_path / "no").exists()
    with pytest.raises(BundleError, match="does not exist"):
        write_html_report(b, target)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("value", ["0", "-3"])
def test_limit_below_one_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    b = write_bundle(tmp_path / "b", [{"x": 1}])
    assert main(["view", str(b), "-o", str(tmp_path / "r.html"), "--limit", value]) == 2
    assert capsys.readouterr().err == (
        "rollout-bundle view: error: --limit must be at least 1; omit it for every sample\n"
    )
    with pytest.raises(BundleError, match="limit must be at least 1; omit it for every sample"):
        write_html_report(b, tmp_path / "r.html", limit=0)
    assert not (tmp_path / "r.html").exists()


def test_a_failed_write_names_the_report_not_a_temporary_file(tmp_path: Path) -> None:
    """/proc is a directory in which no one, root included, can create a file."""
    b = write_bundle(tmp_path / "b", [{"x": 1}])
    with pytest.raises(BundleError) as info:
        write_html_report(b, "/proc/r.html")
    message = str(info.value)
    assert message.startswith("/proc/r.html: cannot write the report: ") and ".tmp" not in message


def test_packed_bundle_reads_each_stored_file_once(tmp_path: Path) -> None:
    """One 8 MiB screenshot referenced 150 times: view's own reads of media are one file's worth.

    Counted with the kernel's per-process read counter (/proc/self/io rchar) around the pictures
    step in a fresh interpreter, so nothing else in the test process is counted."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux) to count bytes read")
    import numpy as np

    run = tmp_path / "run"
    noise = np.random.default_rng(0).integers(0, 256, (1600, 1800, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "PNG", compress_level=0)
    big = MediaRef.from_file(put_media(run, buf.getvalue()))
    assert big.size > 8 * 2**20
    b = write_bundle(tmp_path / "b", [{"multimodal_inputs": {"images": [big] * 150}}], media_roots=[run])
    packed = pack_bundle(b, tmp_path / "b.rbundle")
    code = f"""
import sys
from bundles import open_bundle
from trainer_hooks.view._media import pictures
def rchar():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["rchar"])
b = open_bundle({str(packed)!r})
names = [{big.filename!r}] * 150
before = rchar()
shown = pictures(b, names, thumb_width=400, large_width=1280, large_budget=2**30)
assert shown[{big.filename!r}].large is not None
print(rchar() - before, shown[{big.filename!r}].error)
"""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    read, error = proc.stdout.split()
    assert error == "None"
    assert big.size <= int(read) < 2 * big.size, (read, big.size)


def test_a_replay_report_of_another_bundle_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bundles import open_bundle
    from trainer_hooks.replay import bundle_identity

    a = write_bundle(tmp_path / "a", [{"x": 1}])
    b = write_bundle(tmp_path / "b", [{"x": 2}])
    report = {"format": "rollout-bundle-replay", "version": 1, "bundle": str(a),
              "bundle_id": bundle_identity(open_bundle(a)), "samples": [], "summary": {}}  # fmt: skip
    (tmp_path / "a.json").write_text(json.dumps(report))
    assert main(["view", str(b), "-o", str(tmp_path / "r.html"), "--replay", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a replay report of another bundle" in err and str(a) in err
    assert not (tmp_path / "r.html").exists()
    assert main(["view", str(a), "-o", str(tmp_path / "r.html"), "--replay", str(tmp_path / "a.json")]) == 0
