"""``rollout-bundle show`` (samples as JSON) and ``rollout-bundle diff`` (what changed between two)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import put_media

from bundles import MediaRef, pack_bundle, write_bundle
from trainer_hooks.cli import main


def samples(run: Path) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "reward": float(i) / 2,
            "status": "completed",
            "tokens": list(range(40 + i)),
            "rollout_log_probs": np.linspace(-1, 0, 10 + i, dtype=np.float32),
            "raw": b"\x00\x01",
            "pair": (i, "x"),
            "nan": float("nan"),
            "multimodal_inputs": {
                "images": [put_media(run, bytes([i]) * 64), MediaRef.from_file(put_media(run, b"s" * 9))]
            },
        }
        for i in range(3)
    ]


def show(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["show", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_show_summarises_and_names_media_by_bundle_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    b = write_bundle(tmp_path / "b", samples(run), media_roots=[run])
    out = show(capsys, str(b), "1")
    assert [o["position"] for o in out] == [1]
    s = out[0]["sample"]
    assert s["rollout_log_probs"] == {"type": "ndarray", "dtype": "float32", "shape": [11]}
    assert s["tokens"] == {"type": "list", "length": 41, "head": list(range(8))}
    assert s["raw"] == {"type": "bytes", "size": 2}
    assert s["pair"] == [1, "x"] and s["nan"] == "NaN" and s["reward"] == 0.5
    shot = MediaRef.from_bytes(bytes([1]) * 64).filename
    assert s["multimodal_inputs"]["images"] == [
        f"media/{shot}",
        f"media/{MediaRef.from_bytes(b's' * 9).filename}",
    ]
    assert (b / s["multimodal_inputs"]["images"][0]).read_bytes() == bytes([1]) * 64


def test_show_full_keys_negative_and_every_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    b = write_bundle(tmp_path / "b", samples(run), media_roots=[run])
    # A key path found in no sample is an error now (tests/test_bundle_cli_errors.py).
    out = show(capsys, str(b), "-1", "0", "--keys", "reward,multimodal_inputs.images", "--full")
    assert [o["position"] for o in out] == [2, 0]
    assert set(out[0]["sample"]) == {"reward", "multimodal_inputs"}
    assert list(out[0]["sample"]["multimodal_inputs"]) == ["images"]
    full = show(capsys, str(b), "2", "--full")[0]["sample"]
    assert full["tokens"] == list(range(42))
    assert full["rollout_log_probs"]["data"] == pytest.approx(np.linspace(-1, 0, 12).tolist())
    assert full["raw"] == {"type": "bytes", "size": 2, "base64": "AAE="}
    assert [o["position"] for o in show(capsys, str(b))] == [0, 1, 2]


def test_show_of_a_bad_index_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = write_bundle(tmp_path / "b", [{"a": 1}])
    assert main(["show", str(b), "3"]) == 2  # the caller's index, like a bad --keys
    err = capsys.readouterr().err
    assert err == f"rollout-bundle show: error: {b}: sample index 3 is out of range: the bundle holds 1\n"


@pytest.mark.torch
def test_show_summarises_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    b = write_bundle(
        tmp_path / "b", [{"pv": torch.ones(4, 1176, dtype=torch.bfloat16), "thw": torch.tensor([[1, 2, 2]])}]
    )
    s = show(capsys, str(b))[0]["sample"]
    assert s == {
        "pv": {"type": "tensor", "dtype": "bfloat16", "shape": [4, 1176]},
        "thw": {"type": "tensor", "dtype": "int64", "shape": [1, 3]},
    }
    s = show(capsys, str(b), "--full", "--keys", "thw")[0]["sample"]
    assert s["thw"]["data"] == [[1, 2, 2]]


def two_bundles(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    a = samples(run)
    b = copy.deepcopy(a)
    b[0]["reward"] = 9.0
    b[0]["tokens"][5] = -1
    b[1]["rollout_log_probs"] = b[1]["rollout_log_probs"] + 1  # every item differs: one entry
    b[1]["tokens"] = [t + 1 for t in b[1]["tokens"]]
    b[2]["multimodal_inputs"]["images"][0] = put_media(run, b"new" * 5)
    del b[2]["status"]
    b.append({"index": 3})
    pa = write_bundle(tmp_path / "a", a, media_roots=[run], meta={"rollout_id": 1})
    pb = write_bundle(tmp_path / "b", b, media_roots=[run], meta={"rollout_id": 2})
    return pa, pb


def test_diff_reports_added_changed_by_key_path_and_media(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_bundles(tmp_path)
    assert main(["diff", str(a), str(b), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["same"] is False and r["by"] == "position"
    assert r["meta"]["changes"] == [{"path": "meta.rollout_id", "a": 1, "b": 2}]
    assert r["samples"]["added"] == [3] and r["samples"]["removed"] == [] and r["samples"]["unchanged"] == 0
    changed = {c["key"]: c["changes"] for c in r["samples"]["changed"]}
    assert changed[0] == [{"path": "reward", "a": 0.0, "b": 9.0}, {"path": "tokens[5]", "a": 5, "b": -1}]
    tokens, lp = changed[1]
    assert lp["path"] == "rollout_log_probs" and lp["a"]["shape"] == lp["b"]["shape"] == [11]
    assert lp["a"]["sha256"] != lp["b"]["sha256"]
    assert tokens == {"path": "tokens", "length": 41, "items_differ": 41, "first": 0, "a": 0, "b": 1}
    old, new = MediaRef.from_bytes(bytes([2]) * 64).filename, MediaRef.from_bytes(b"new" * 5).filename
    assert changed[2] == [  # in the order of the sample's keys
        {"path": "status", "only_in": "a", "a": "completed"},
        {"path": "multimodal_inputs.images[0]", "a": f"media/{old}", "b": f"media/{new}"},
    ]
    assert r["media"]["only_in_a"] == [{"path": f"media/{old}", "size": 64}]
    assert r["media"]["only_in_b"] == [{"path": f"media/{new}", "size": 15}]

    assert main(["diff", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "  tokens[5]: 5 -> -1\n" in text
    assert "  tokens: 41 of 41 items differ, first at [0]: 0 -> 1\n" in text
    assert "  rollout_log_probs: ndarray float32[11], different content\n" in text
    assert "sample 3 only in B (added)\n" in text and f"media only in A: media/{old} (64 B)\n" in text


def test_diff_by_key_and_of_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    s = samples(run)
    a = write_bundle(tmp_path / "a", s, media_roots=[run])
    b = write_bundle(tmp_path / "b", [s[2], s[0]], media_roots=[run])  # sample 1 dropped, order changed
    assert main(["diff", str(a), str(b), "--by", "index", "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["samples"] == {"added": [], "removed": [1], "changed": [], "unchanged": 2}
    assert r["media"]["only_in_a"] == [
        {"path": f"media/{MediaRef.from_bytes(bytes([1]) * 64).filename}", "size": 64}
    ]
    # The same content in another directory is the same bundle.
    copy_ = write_bundle(tmp_path / "c", s, media_roots=[run])
    assert main(["diff", str(a), str(copy_)]) == 0
    assert capsys.readouterr().out.endswith(
        "same: samples 0 added, 0 removed, 0 changed, 3 unchanged; "
        "media 0 only in A, 0 only in B, 4 in both\n"
    )
    assert main(["diff", str(a), str(b), "--by", "nope"]) == 2  # the caller's key path, like --keys
    assert "has no key path 'nope'" in capsys.readouterr().err
    # A packed copy, read in place, is the same bundle; show reads it like the directory.
    pack_bundle(a, tmp_path / "a.rbundle")
    assert main(["diff", str(a), str(tmp_path / "a.rbundle")]) == 0
    capsys.readouterr()
    assert show(capsys, str(tmp_path / "a.rbundle"), "1") == show(capsys, str(a), "1")


def test_diff_by_a_key_that_repeats_names_both_samples_on_either_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    s = samples(run)
    a = write_bundle(tmp_path / "a", s, media_roots=[run])
    twice = write_bundle(tmp_path / "twice", [s[0], s[1], s[0]], media_roots=[run])
    for left, right in ((a, twice), (twice, a)):
        assert main(["diff", str(left), str(right), "--by", "index"]) == 2  # the caller's --by
        err = capsys.readouterr().err
        assert err.startswith("rollout-bundle diff: error: ") and err.count("\n") == 1
        assert f"{twice}: samples[2].index: 0 repeats samples[0]" in err


def test_diff_limit_below_zero_is_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    a = write_bundle(tmp_path / "a", samples(run), media_roots=[run])
    with pytest.raises(SystemExit) as e:
        main(["diff", str(a), str(a), "--limit", "-1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("error: argument --limit: expected an int >= 0, found -1\n")


def test_diff_names_a_shortened_list_by_its_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A screenshot dropped from a sample reads "4 vs 3 items (list shortened ...)", not "different
    content" (issue 24, item 8); an inserted one names where the lists part."""
    run = tmp_path / "run"
    shots = [put_media(run, bytes([i]) * 64) for i in range(4)]
    a = write_bundle(tmp_path / "a", [{"images": shots, "tokens": list(range(50))}], media_roots=[run])
    b = write_bundle(tmp_path / "b", [{"images": shots[:3], "tokens": list(range(60))}], media_roots=[run])
    c = write_bundle(tmp_path / "c", [{"images": [shots[0], shots[3], *shots[1:]], "tokens": list(range(50))}],
                     media_roots=[run])  # fmt: skip
    assert main(["diff", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    dropped = MediaRef.from_bytes(bytes([3]) * 64).filename
    assert (
        f'  images: 4 vs 3 items (list shortened: 1 item(s) only in A, from [3]: "media/{dropped}")\n' in text
    )
    assert "  tokens: 50 vs 60 items (list extended: 10 item(s) only in B)\n" in text  # summarised: no item
    assert "different content" not in text
    assert main(["diff", str(b), str(c)]) == 1
    text = capsys.readouterr().out
    first = MediaRef.from_bytes(bytes([1]) * 64).filename
    assert f'  images: 3 vs 5 items, first difference at [1]: "media/{first}" -> "media/{dropped}"\n' in text
    assert main(["diff", str(a), str(b), "--json"]) == 1
    change = json.loads(capsys.readouterr().out)["samples"]["changed"][0]["changes"][0]
    assert (change["path"], change["length_a"], change["length_b"], change["first"]) == ("images", 4, 3, 3)
