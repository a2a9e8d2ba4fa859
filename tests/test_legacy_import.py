"""``rollout-bundle import-dump``: legacy torch.save dumps become bundles; pickle needs consent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import digest_of

from bundles import PACK_SUFFIX, BundleFormatError, open_bundle
from trainer_hooks import (
    LegacyDumpError,
    PickleRefusedError,
    import_legacy_dump,
    load_debug_rollout_data,
    parse_args,
)
from trainer_hooks.cli import main

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")


def write_legacy_dump(tmp_path: Path, *, missing: bool = False) -> tuple[Path, Path]:
    """A dump as Miles' save_debug_rollout_data wrote it: torch.save of sample dicts."""
    old_run = tmp_path / "old_run"
    old_run.mkdir()
    shot = old_run / "screen.png"
    Image.new("RGB", (8, 6), (200, 10, 10)).save(shot)
    gone = str(old_run / "deleted.png")
    samples = [
        {
            "group_index": 0,
            "index": 0,
            "prompt": "click OK",
            "tokens": [1, 2, 3],
            "multimodal_inputs": {"images": [Image.new("RGB", (4, 3), (0, 128, 255)), str(shot)]},
            "multimodal_train_inputs": {
                "pixel_values": torch.arange(24, dtype=torch.float32).reshape(2, 12),
                "image_grid_thw": torch.tensor([[1, 2, 2]], dtype=torch.int64),
                "bf": torch.ones(2, dtype=torch.bfloat16),
            },
            "response": "ok",
            "response_length": 1,
            "reward": 1.0,
            "status": "completed",
            "metadata": {"source": "gui"},
        },
        {
            "group_index": 0,
            "index": 1,
            "prompt": "text only",
            "tokens": [4],
            "multimodal_inputs": {"images": [gone] if missing else []},
            "status": "truncated",
        },
    ]
    src = tmp_path / "rollout_3.pt"
    torch.save({"rollout_id": 3, "metadata": {"kl": 0.1}, "samples": samples}, src)
    return src, shot


def test_refuses_without_trust_pickle(tmp_path, capsys):
    src, _ = write_legacy_dump(tmp_path)
    with pytest.raises(PickleRefusedError, match="runs pickle, which can execute arbitrary code"):
        import_legacy_dump(src, tmp_path / "out")
    assert main(["import-dump", str(src), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "refusing to load" in err and "--trust-pickle" in err and "pickle" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("suffix", ["", PACK_SUFFIX], ids=["directory", "packed"])
def test_import_converts_images_and_keeps_tensors(tmp_path, suffix, capsys):
    src, shot = write_legacy_dump(tmp_path)
    out = tmp_path / f"dump_3{suffix}"
    assert main(["import-dump", str(src), "-o", str(out), "--trust-pickle"]) == 0
    assert "imported" in capsys.readouterr().out
    shot_digest = digest_of(shot.read_bytes())
    (tmp_path / "old_run" / "screen.png").unlink()  # the old run's media is gone; the bundle is not

    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--load-debug-rollout-data",
            str(tmp_path / ("dump_{rollout_id}" + suffix)),
        ]
    )
    loaded, metadata = load_debug_rollout_data(args, 3)
    assert metadata == {"kl": 0.1}
    first, second = loaded
    pil_img, path_ref = first.multimodal_inputs["images"]
    # A PIL image stays a PIL image (stored as PNG, opened from the bundle).
    assert isinstance(pil_img, Image.Image) and pil_img.size == (4, 3)
    assert pil_img.getpixel((3, 2)) == (0, 128, 255)
    # A path string stays a path string: now a path to the file stored in the bundle.
    assert type(path_ref) is str and path_ref != str(shot)
    assert digest_of(Path(path_ref).read_bytes()) == shot_digest
    mti = first.multimodal_train_inputs
    assert torch.equal(mti["pixel_values"], torch.arange(24, dtype=torch.float32).reshape(2, 12))
    assert mti["image_grid_thw"].dtype == torch.int64
    assert mti["bf"].dtype == torch.bfloat16
    assert second.status.value == "truncated" and second.multimodal_inputs == {"images": []}
    if not suffix:
        bundle = open_bundle(out, verify="full")
        assert bundle.kind == "debug_dump"
        assert bundle.meta["imported_from"] == "rollout_3.pt" and bundle.meta["legacy_format"] == "torch.save"
        assert bundle.meta["rollout_id"] == 3


def test_missing_media_is_named_or_kept(tmp_path):
    src, _ = write_legacy_dump(tmp_path, missing=True)
    with pytest.raises(
        LegacyDumpError, match=r"samples\[1\]\.multimodal_inputs\.images\[0\]: media file .*deleted\.png"
    ):
        import_legacy_dump(src, tmp_path / "out", trust_pickle=True)
    assert not (tmp_path / "out").exists()
    import_legacy_dump(src, tmp_path / "out", trust_pickle=True, missing_media="keep")
    rows = list(open_bundle(tmp_path / "out").samples())
    assert rows[1]["multimodal_inputs"]["images"] == [str(tmp_path / "old_run" / "deleted.png")]


def test_not_a_dump_and_existing_output(tmp_path):
    bad = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, bad)
    with pytest.raises(LegacyDumpError, match=r"weights\.pt: expected a dict with 'samples'"):
        import_legacy_dump(bad, tmp_path / "o", trust_pickle=True)
    src, _ = write_legacy_dump(tmp_path)
    (tmp_path / "o").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_hooks.cli",
            "import-dump",
            str(src),
            "-o",
            str(tmp_path / "o"),
            "--trust-pickle",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "destination exists" in r.stderr  # the caller's: pass --force


def test_a_legacy_dump_given_to_the_loader_names_the_import_command(tmp_path):
    """Miles' tooling points --load-debug-rollout-data at its .pt files: say what they are."""
    src, _ = write_legacy_dump(tmp_path)
    args = parse_args(
        ["--rollout-batch-size", "1", "--load-debug-rollout-data", str(tmp_path / "rollout_{rollout_id}.pt")]
    )
    with pytest.raises(BundleFormatError) as e:
        load_debug_rollout_data(args, 3)
    msg = str(e.value)
    assert "a legacy torch.save debug dump, not a bundle" in msg
    assert f"rollout-bundle import-dump {src} -o {tmp_path / 'rollout_3_bundle'} --trust-pickle" in msg
    # A pickle written by torch.save's legacy (non-zip) format is recognised too.
    old = tmp_path / "rollout_4.pt"
    torch.save({"rollout_id": 4, "samples": []}, old, _use_new_zipfile_serialization=False)
    with pytest.raises(BundleFormatError, match=r"rollout_4\.pt: a legacy torch\.save debug dump"):
        load_debug_rollout_data(args, 4)
    # The command it prints works.
    assert (
        main(["import-dump", str(src), "-o", str(tmp_path / f"rollout_3{PACK_SUFFIX}"), "--trust-pickle"])
        == 0
    )
    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--load-debug-rollout-data",
            str(tmp_path / f"rollout_{{rollout_id}}{PACK_SUFFIX}"),
        ]
    )
    assert len(load_debug_rollout_data(args, 3)[0]) == 2


@pytest.mark.parametrize(
    ("name", "stored_id", "evaluation", "rollout_id"),
    [
        ("eval_4.pt", 4, True, "eval_4"),  # Miles' template formatted with "eval_4"; stores 4
        ("rollout_eval_4.pt", 4, True, "eval_4"),
        ("rollout_4.pt", 4, False, 4),
        ("eval_40.pt", 4, False, 4),  # eval_40 is not eval_4
        ("x.pt", "eval_2", True, "eval_2"),
    ],
)
def test_imported_eval_dumps_record_evaluation(tmp_path, name, stored_id, evaluation, rollout_id):
    src = tmp_path / name
    torch.save({"rollout_id": stored_id, "metadata": {}, "samples": [{"status": "completed"}]}, src)
    out = import_legacy_dump(src, tmp_path / "out", trust_pickle=True)
    meta = open_bundle(out).meta
    assert (meta["evaluation"], meta["rollout_id"]) == (evaluation, rollout_id)
    # An explicit answer wins (CLI: --evaluation / --no-evaluation).
    assert (
        main(["import-dump", str(src), "-o", str(tmp_path / "o2"), "--trust-pickle", "--no-evaluation"]) == 0
    )
    assert open_bundle(tmp_path / "o2").meta["evaluation"] is False
