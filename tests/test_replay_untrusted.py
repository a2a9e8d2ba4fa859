"""``rollout-bundle replay`` on bundles from anyone (issue 16): the hostile corpus of
``tests/vectors/hostile/replay/`` (``generate_replay.py``), outside paths, FIFOs, permission
errors, packed bundles read in place, processor families, reports of another bundle, and the
one-line refusals of bad usage. Real files, the real processor, real subprocesses for what could
hang."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from helpers import noise_png as png  # noqa: E402
from helpers.replay import make_dump  # noqa: E402

from bundles import MediaRef, pack_bundle, write_bundle  # noqa: E402
from trainer_hooks import load_processor, replay_bundle  # noqa: E402
from trainer_hooks.cli import main  # noqa: E402
from trainer_hooks.replay import bundle_identity, check_report_bundle  # noqa: E402
from trainer_hooks.replay._cli import VIOLATION_KINDS  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.processor]

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "vectors" / "hostile" / "replay"
TABLE: dict[str, dict] = json.loads((CORPUS / "expected.json").read_text())


def run_cli(*argv: str) -> int:
    return main(["replay", *argv, "--no-progress"])


def one_sample(images: list, **extra) -> dict:
    return {
        "index": 4, "tokens": [1, 2, 3, 4], "response_length": 1, "loss_mask": [1], "reward": 0.0,
        "status": "completed", "multimodal_inputs": {"images": images}, **extra,
    }  # fmt: skip


META = {"processor": {"model_path": "Qwen/Qwen2-VL-7B-Instruct"}, "training_dtype": "bf16"}


# ------------------------------------------------------------------------------------ hostile corpus


def test_the_replay_table_lists_every_vector_and_the_generator_agrees():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_replay", CORPUS.parent / "generate_replay.py")
    gen = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(gen)  # type: ignore[union-attr]
    assert gen.table() == TABLE  # regenerate when this fails
    assert {p.name for p in CORPUS.iterdir()} - {"expected.json"} == set(TABLE)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_hostile_replay_vector_is_a_named_problem_or_a_one_line_refusal(tmp_path, capsys, name):
    """Defects 2 (outside paths), 1 (EPS as PNG), 5 (settings), 8 (family, null processor)."""
    row = TABLE[name]
    bundle = tmp_path / name
    shutil.copytree(CORPUS / row["path"], bundle)
    report, payloads = tmp_path / "r.json", tmp_path / "p.jsonl"
    status = run_cli(str(bundle), "--report", str(report), "--payloads-out", str(payloads))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if row["outcome"] == "refused":
        assert status == 1 and not report.exists() and not payloads.exists()
        assert err.startswith("rollout-bundle replay: error: ") and err.count("\n") == 1, err
        assert row["message"] in err, err
        return
    assert status == (1 if row["kind"] in VIOLATION_KINDS else 0)
    assert "problems       none" not in out
    doc = json.loads(report.read_text())
    messages = [p["message"] for e in doc["samples"] for p in e["problems"] if p["kind"] == row["kind"]]
    messages += [p for p in doc["processor"]["disagreements"] if row["kind"] == "processor"]
    assert any(row["message"] in m for m in messages), messages
    if row["kind"] == "rebuild":  # nothing was rebuilt, and no payload carries the image
        assert doc["samples"][0]["images"] == []
        assert payloads.read_text() == ""


# ------------------------------------------------------------------------------------- outside paths


def test_outside_files_are_never_read_or_leaked_by_default(tmp_path, capsys, monkeypatch):
    """Defect 2: an absolute path to a private image, a ``../`` path that resolves from the
    working directory: neither is opened, nothing of them lands in the report or the payloads."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.png").write_bytes(png(56, 56, seed=9))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    bundle = write_bundle(
        tmp_path / "b", [one_sample([str(private / "secret.png"), "../private/secret.png"])],
        kind="debug_dump", meta=META, outside_paths="keep",
    )  # fmt: skip
    report, payloads = tmp_path / "r.json", tmp_path / "p.jsonl"
    assert run_cli(str(bundle), "--report", str(report), "--payloads-out", str(payloads)) == 1
    out = capsys.readouterr().out
    assert (
        "multimodal_inputs.images[0]: " + repr(str(private / "secret.png")) + " is not a media file stored"
        in out
    )
    doc = json.loads(report.read_text())
    assert doc["samples"][0]["images"] == [] and doc["summary"]["images"] == 0
    assert payloads.read_text() == ""  # no payload with the image (it is a payload problem)
    secret_b64 = base64.b64encode(png(56, 56, seed=9)[:30]).decode()[:20]
    assert secret_b64 not in report.read_text()

    # With the flag the user asked for it: both are read (the relative one from the working directory).
    run_cli(str(bundle), "--allow-outside-media", "--report", str(report), "--payloads-out", str(payloads))
    doc = json.loads(report.read_text())
    assert [p["kind"] for p in doc["samples"][0]["problems"]] == ["token_count"]  # no placeholders in tokens
    assert [i["image_grid_thw"]["values"] for i in doc["samples"][0]["images"]] == [[[1, 4, 4]], [[1, 4, 4]]]
    assert len(json.loads(payloads.read_text())["image_data"]) == 2


def _replay_subprocess(args: list[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "replay", *args, "--no-progress"],
        capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.PIPE, **kw,
    )  # fmt: skip


def test_a_fifo_or_dev_stdin_never_hangs_even_with_the_flag(tmp_path):
    """Defect 2: by default never opened; with --allow-outside-media refused as not a regular
    file (a real subprocess whose stdin stays open: a blocking read would hang until the timeout)."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    bundle = write_bundle(
        tmp_path / "b",
        [one_sample([str(fifo), "/dev/stdin"])],
        kind="debug_dump",
        meta=META,
        outside_paths="keep",
    )
    for flags in ([], ["--allow-outside-media"]):
        done = _replay_subprocess([str(bundle), *flags], timeout=240)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        if flags:
            assert f"images[0]: {str(fifo)!r}: not a regular file; only regular files are read" in done.stdout
            assert (
                "images[1]: '/dev/stdin': not a regular file" in done.stdout or "images[1]" not in done.stdout
            )
        else:
            assert f"images[0]: {str(fifo)!r} is not a media file stored in the bundle" in done.stdout


def test_permission_denied_on_an_outside_file_is_named_not_reported_as_missing(tmp_path, capsys):
    """Defect 9, with --allow-outside-media: a file the process may not read (a write-only sysfs
    attribute refuses even root) says "permission denied", not "missing"."""
    path = "/sys/bus/pci/rescan"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        pytest.skip(f"{path} is readable here: no file refuses this process")
    except PermissionError:
        pass
    except OSError:
        pytest.skip(f"{path} does not exist here")
    bundle = write_bundle(
        tmp_path / "b", [one_sample([path])], kind="debug_dump", meta=META, outside_paths="keep"
    )
    assert run_cli(str(bundle), "--allow-outside-media") == 1
    out = capsys.readouterr().out
    assert f"multimodal_inputs.images[0]: {path!r}: permission denied" in out and "not found" not in out


def test_permission_denied_on_stored_media_is_named_not_reported_as_missing(tmp_path):
    """Defect 9: a stored media file the user cannot read says "permission denied". Root reads
    anything, so there the replay runs as ``nobody`` in a subprocess (skipped where ``nobody``
    cannot run this interpreter)."""
    kw = {"user": 65534} if os.geteuid() == 0 else {}
    if kw:
        try:
            probe = subprocess.run(
                [sys.executable, "-c", "import torch, transformers"], capture_output=True, **kw
            )
        except OSError:
            probe = None
        if probe is None or probe.returncode != 0:
            pytest.skip("running as root, and user nobody cannot run this Python to drop the privilege")
    base = Path(tmp_path if not kw else os.environ.get("TMPDIR", "/tmp")) / f"perm-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        run = base / "run"
        run.mkdir(mode=0o755)
        (run / "a.png").write_bytes(png(28, 28, seed=1))
        bundle = write_bundle(
            base / "b", [one_sample([MediaRef.from_file(run / "a.png")])], kind="debug_dump", meta=META,
            link="copy",
        )  # fmt: skip
        if kw:  # nobody must read the sources and the bundle, all but the one file
            shutil.copytree(ROOT / "trainer_hooks", base / "src" / "trainer_hooks")
            shutil.copytree(ROOT / "bundles", base / "src" / "bundles")
        for p in [base, *base.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        (stored,) = (bundle / "media").iterdir()
        os.chmod(stored, 0o000)
        env = {**os.environ, "PYTHONPATH": str(base / "src" if kw else ROOT), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HOME": str(base), "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "trainer_hooks.cli", "replay", str(bundle), "--no-progress"],
            capture_output=True, text=True, timeout=240, env=env, cwd=str(base), **kw,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert (
            f"multimodal_inputs.images[0]: media/{stored.name}: cannot read: permission denied" in done.stdout
        )
        assert "missing" not in done.stdout and "not found" not in done.stdout
    finally:
        for p in [base, *base.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        shutil.rmtree(base)


# ------------------------------------------------------------------------------------------- defects 9


def test_image_errors_name_the_sample_and_image_index(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "good.png").write_bytes(png(28, 28, seed=1))
    (run / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # PNG magic, no image
    refs = [MediaRef.from_file(run / "good.png"), MediaRef.from_file(run / "bad.png")]
    bundle = write_bundle(tmp_path / "b", [one_sample(refs)], media_roots=[run], kind="debug_dump", meta=META)
    assert run_cli(str(bundle)) == 1
    out = capsys.readouterr().out
    assert "[rebuild] sample index 4 (position 0): multimodal_inputs.images[1]: cannot decode as PNG" in out


def test_packed_replay_reads_in_place_and_leaves_nothing_beside_the_file(tmp_path):
    dump = make_dump(tmp_path / "d", 2)
    packed = pack_bundle(dump, tmp_path / "out" / "dump.rbundle")
    before = sorted(os.listdir(packed.parent))
    report = replay_bundle(packed)
    assert sorted(os.listdir(packed.parent)) == before == ["dump.rbundle"]  # no hidden .unpacked copy
    assert report["summary"]["images"] == 4 and report["summary"]["problems"] == {}
    assert "opened" not in report


def test_errors_name_the_packed_file_never_a_temporary_directory(tmp_path, capsys):
    bundle = write_bundle(
        tmp_path / "b", [one_sample([])], kind="debug_dump",
        meta={"processor": {"model_path": "Qwen/Qwen2-VL-7B-Instruct", "mm_process_config": {"patch_size": 0}}},
    )  # fmt: skip
    packed = pack_bundle(bundle, tmp_path / "x.rbundle")
    assert run_cli(str(packed)) == 1
    err = capsys.readouterr().err
    assert f"{packed}: meta.processor.mm_process_config.patch_size: expected an int in 1..128, found 0" in err
    assert ".unpacked" not in err and ".tmp" not in err and err.count("\n") == 1


def test_ray_without_ray_installed_is_one_line(tmp_path, capsys, monkeypatch):
    dump = make_dump(tmp_path, 1)
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees where Ray is not installed
    assert run_cli(str(dump), "--ray") == 2
    assert capsys.readouterr().err == (
        "rollout-bundle replay: error: --ray needs Ray, which is not installed: pip install 'rollout-bundles[ray]'\n"
    )


def test_limit_zero_is_refused_in_one_line(tmp_path, capsys):
    dump = make_dump(tmp_path, 1)
    capsys.readouterr()
    assert run_cli(str(dump), "--limit", "0") == 2
    assert (
        capsys.readouterr().err
        == "rollout-bundle replay: error: --limit must be at least 1; omit it for every sample\n"
    )
    with pytest.raises(ValueError, match="limit: expected an int >= 1"):
        replay_bundle(dump, limit=0)


# ------------------------------------------------------------------------------------------ defect 7


def test_a_report_of_another_bundle_is_refused_by_expect_and_view(tmp_path, capsys):
    a, b = make_dump(tmp_path / "a", 1), make_dump(tmp_path / "b", 1, size=(140, 84))
    report = tmp_path / "a.json"
    assert run_cli(str(a), "--report", str(report)) == 0
    doc = json.loads(report.read_text())
    assert doc["bundle_id"] == bundle_identity(__import__("bundles").open_bundle(a))
    capsys.readouterr()
    assert run_cli(str(b), "--expect", str(report)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a replay report of another bundle" in err and str(b) in err
    assert main(["view", str(b), "-o", str(tmp_path / "v.html"), "--replay", str(report)]) == 2  # as --expect
    err = capsys.readouterr().err
    assert "a replay report of another bundle" in err and not (tmp_path / "v.html").exists()
    # The same content elsewhere (moved, packed) is the same bundle.
    packed = pack_bundle(a, tmp_path / "a.rbundle")
    check_report_bundle(report, packed)
    assert run_cli(str(packed), "--expect", str(report)) == 0
    # A report from before bundle_id existed is matched by path.
    old = {k: v for k, v in doc.items() if k != "bundle_id"}
    check_report_bundle(old, a)
    with pytest.raises(__import__("bundles").BundleError, match="records no bundle_id"):
        check_report_bundle(old, b)


# ------------------------------------------------------------------------------------------ defect 8


@pytest.mark.parametrize(
    "model, family, patch, tokens",
    [
        ("Qwen/Qwen2-VL-7B-Instruct", "qwen2_vl", 14, 2691),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", 14, 2691),
        ("Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl", 16, 2040),
        ("/models/qwen3-vl-30b-a3b-instruct", "qwen3_vl", 16, 2040),
    ],
)
def test_processor_is_picked_by_the_recorded_model_family(model, family, patch, tokens):
    proc = load_processor({"model_path": model, "image_processor_backend": "pil"})
    s = proc.settings
    assert (s["family"], s["patch_size"], s["source"]) == (
        family,
        patch,
        f"shipped:{family}_preprocessor_config.json",
    )
    out = proc(images=[Image.new("RGB", (1920, 1080), (40, 80, 120))], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    assert t * h * w // 4 == tokens and proc.disagreements == []


def test_a_local_model_of_another_family_is_refused_naming_it(tmp_path):
    model = tmp_path / "gemma"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    (model / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Gemma3ImageProcessor"})
    )
    with pytest.raises(
        ValueError, match=r"config\.json model_type 'gemma3' is not a family replay can rebuild"
    ):
        load_processor({"model_path": str(model)})
    os.unlink(model / "preprocessor_config.json")
    os.mkfifo(model / "preprocessor_config.json")  # never blocks
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: not a regular file"):
        load_processor({"model_path": str(model)})


def test_a_recorded_processor_without_model_path_is_a_named_problem():
    proc = load_processor({"mm_process_config": {"image": {"max_pixels": 1003520}}})
    assert any("model_path: not recorded; assumed the Qwen2-VL family" in d for d in proc.disagreements)


def test_view_replay_of_its_own_bundle_still_works(tmp_path, capsys):
    a = make_dump(tmp_path, 1)
    report = tmp_path / "a.json"
    assert run_cli(str(a), "--report", str(report)) == 0
    assert main(["view", str(a), "-o", str(tmp_path / "v.html"), "--replay", str(report)]) == 0
    assert (tmp_path / "v.html").is_file()
