"""Miles' own tools on a ``--dump-details`` dump written by our hooks: Miles' dashboard reader
(through :class:`trainer_hooks.miles.dashboard.BundleDumpReader`), Miles' CI injection (from
:func:`trainer_hooks.dumps.export_torch_dump`), and subsample ratios as Miles takes them."""

from __future__ import annotations

import os
import time
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.miles_snapshot import require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch
pytest.importorskip("polars", reason="Miles' dashboard reader needs polars (the miles-tests extra)")

from miles.dashboard.dump_reader import DumpReader  # noqa: E402
from miles.ray.rollout.debug_data import RolloutDataInjectionUtil  # noqa: E402
from miles.ray.rollout.debug_data import load_debug_rollout_data as miles_load  # noqa: E402
from miles.utils.types import Sample  # noqa: E402

from trainer_hooks import load_debug_rollout_data, parse_args, save_debug_rollout_data, store_media  # noqa: E402
from trainer_hooks.dumps import export_torch_dump  # noqa: E402
from trainer_hooks.miles.dashboard import BundleDumpReader  # noqa: E402
from trainer_hooks.testing import png_bytes  # noqa: E402


def make_samples(args, n=6):
    out = []
    for i in range(n):
        image = str(store_media(args, png_bytes(8, 8, (i, 2, 3))).path)
        out.append(
            Sample(
                group_index=i // 2,
                index=i,
                prompt=f"open settings {i}",
                tokens=[5, 6, 7, 8 + i, 9],
                multimodal_inputs={"images": [image]},
                response="click",
                response_length=2,
                loss_mask=[1, 0],
                rollout_log_probs=[-0.5, -0.125],
                reward=float(i),
                weight_versions=["3"],
                status=Sample.Status.COMPLETED,
            )
        )
    return out


@pytest.fixture
def dump(tmp_path):
    """A dump written as ``--dump-details DIR`` lays it out: ``DIR/rollout_data/{rollout_id}.pt``."""
    dump_dir = tmp_path / "details"
    args = Namespace(
        save_debug_rollout_data=f"{dump_dir}/rollout_data/{{rollout_id}}.pt",
        shared_media_dir=str(tmp_path / "media"),
        run_uuid="run-1",
    )
    samples = make_samples(args)
    path = save_debug_rollout_data(args, samples, 3, False, metadata={"step": 3})
    old = time.time() - 3600  # a finished dump: older than the reader's MIN_AGE_SECONDS
    os.utime(path, (old, old))
    return dump_dir, path, samples


def test_miles_dashboard_reader_shows_our_dump(dump):
    dump_dir, path, samples = dump
    with pytest.raises(Exception):  # noqa: B017 - Miles' own reader cannot torch.load a bundle
        DumpReader(dump_dir).load_joined(3)
    reader = BundleDumpReader(dump_dir)
    assert reader.rollout_ids().train == [3]
    joined = reader.load_joined(3)
    assert [type(s) for s in joined.samples] == [Sample] * len(samples)
    for got, want in zip(joined.samples, samples, strict=True):
        assert (got.index, got.tokens, got.loss_mask, got.rollout_log_probs, got.reward, got.status) == (
            want.index,
            want.tokens,
            want.loss_mask,
            want.rollout_log_probs,
            want.reward,
            want.status,
        )
        (image,) = got.multimodal_inputs["images"]
        assert image.startswith(str(path))
        assert Path(image).read_bytes() == Path(want.multimodal_inputs["images"][0]).read_bytes()
    # The token view's parquet mirror is built by Miles' reader from what ours loaded.
    row = reader._rollout_columns(3, 4, evaluation=False)
    assert (row["tokens"], row["loss_mask"], row["total_length"]) == ([5, 6, 7, 12, 9], [1, 0], 5)
    assert (dump_dir / "dashboard_columns" / "rollout_3.parquet").is_file()


def test_miles_ci_injection_loads_an_exported_dump(dump, tmp_path):
    _, path, samples = dump
    out = export_torch_dump(path, tmp_path / "inject" / "3.pt")
    args = Namespace(
        ci_inject_rollout_data_path=str(tmp_path / "inject" / "{rollout_id}.pt"),
        ci_inject_rollout_data_start_rollout_id=0,
        ci_inject_rollout_data_min_match_ratio=0.99,
    )
    assert out.is_file() and RolloutDataInjectionUtil.should_inject(args, 3)
    injected, metadata = RolloutDataInjectionUtil.load(args, rollout_id=3)
    assert metadata == {"step": 3} and [s.index for s in injected] == [s.index for s in samples]
    RolloutDataInjectionUtil.assert_matches_generated(
        args, generated=samples, injected=injected, rollout_id=3
    )


@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0])
def test_subsample_ratios_as_miles_takes_them(dump, tmp_path, ratio):
    _, path, _ = dump
    export_torch_dump(path, tmp_path / "pt" / "3.pt")
    ours = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--load-debug-rollout-data",
            str(path.parent / "{rollout_id}.pt"),
            "--load-debug-rollout-data-subsample",
            str(ratio),
        ]
    )
    theirs = Namespace(
        load_debug_rollout_data=str(tmp_path / "pt" / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=ratio,
    )
    got, _ = load_debug_rollout_data(ours, 3)
    want, _ = miles_load(theirs, 3)
    assert [s.index for s in got] == [s.index for s in want]
    if ratio == 0.0:
        assert len(got) == 6  # Miles' slicing keeps every row at 0


def test_the_dashboard_launcher_serves_our_dump_over_http_without_miles_rollout_deps(dump, tmp_path):
    """``python -m trainer_hooks.miles.dashboard`` end to end: Miles' FastAPI app under uvicorn, in a
    child process that has Miles' dashboard but not its rollout stack (no sglang stand-ins: a laptop
    looking at dumps), answering over HTTP on 127.0.0.1 from our bundled dump."""
    pytest.importorskip("uvicorn", reason="serving Miles' dashboard needs fastapi and uvicorn (miles-tests)")
    pytest.importorskip("fastapi", reason="serving Miles' dashboard needs fastapi and uvicorn (miles-tests)")
    import json
    import socket
    import subprocess
    import sys
    import urllib.request

    dump_dir, _, samples = dump
    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(MILES)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_hooks.miles.dashboard", "--dump-details", str(dump_dir),
         "--host", "127.0.0.1", "--port", str(port), "--cache-dir", str(tmp_path / "cache")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                meta = get("/api/meta")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the dashboard did not come up:\n{proc.communicate(timeout=5)[0][-3000:]}"
                    ) from None
                time.sleep(0.2)
        assert meta["rollout_ids"]["train"] == [3]
        rows = get("/api/rollout/3/summary")["rows"]
        assert sorted(r["sample_index"] for r in rows) == [s.index for s in samples]
        assert {r["sample_index"]: r["group_index"] for r in rows} == {
            s.index: s.group_index for s in samples
        }
        tokens = get("/api/rollout/3/sample/4/tokens")  # Miles' token view of sample 4
        assert (
            tokens["token_ids"] == samples[4].tokens
            and tokens["rollout_log_probs"] == samples[4].rollout_log_probs
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_stock_miles_step_leaves_a_bundled_dump_through_its_log_function_option(tmp_path, caplog):
    """``--custom-rollout-log-function-path trainer_hooks.miles.log_rollout_bundle``: Miles' own
    ``log_rollout_data`` (what ``RolloutManager.generate`` calls after its pickle dump) writes the
    step's samples as a bundle beside that dump, PIL screenshots stored as PNG; Miles' metrics
    logging still runs."""
    from miles.ray.rollout.metrics import log_rollout_data
    from PIL import Image

    from bundles import open_bundle
    from trainer_hooks.miles import bundle_dump_template

    template = str(tmp_path / "details" / "rollout_data" / "{rollout_id}.pt")
    args = Namespace(
        custom_rollout_log_function_path="trainer_hooks.miles.log_rollout_bundle",
        save_debug_rollout_data=template,  # what Miles derives from --dump-details
        load_debug_rollout_data=None,
        log_passrate=False,
        advantage_estimator="grpo",
        reward_key=None,
        sglang_speculative_algorithm=None,
        log_reward_category=None,
        rollout_num_gpus=1,
        wandb_always_use_train_step=False,
    )
    colours = [(i * 40, 2, 3) for i in range(4)]
    samples = [
        Sample(index=i, group_index=i // 2, prompt=f"task {i}", tokens=[1, 2, 3 + i], response="click(10, 20)",
               response_length=1, reward=float(i), status=Sample.Status.COMPLETED,
               multimodal_inputs={"images": [Image.new("RGB", (8, 8), colours[i])]})
        for i in range(4)
    ]  # fmt: skip
    with caplog.at_level("INFO", logger="miles.ray.rollout.metrics"):
        log_rollout_data(3, args, samples, {}, 1.5)
    assert any(r.getMessage().startswith("perf 3:") for r in caplog.records)  # Miles' logging ran on
    path = tmp_path / "details" / "rollout_data" / "3.bundle"
    assert bundle_dump_template(args) == str(path).replace("3.bundle", "{rollout_id}.bundle")
    assert bundle_dump_template(Namespace(dump_details=str(tmp_path / "d"))) == str(
        tmp_path / "d" / "rollout_data" / "{rollout_id}.bundle"
    )
    assert bundle_dump_template(Namespace()) is None
    bundle = open_bundle(path, verify="full")
    assert bundle.meta["rollout_id"] == 3 and bundle.meta["metadata"] == {"rollout_time_s": 1.5}
    load_args = Namespace(
        load_debug_rollout_data=template[: -len(".pt")] + ".bundle", load_debug_rollout_data_subsample=None
    )
    back, metadata = load_debug_rollout_data(load_args, 3, sample_cls=Sample)
    assert metadata == {"rollout_time_s": 1.5}
    assert [s.index for s in back] == [0, 1, 2, 3] and [s.tokens for s in back] == [s.tokens for s in samples]
    for s, colour in zip(back, colours, strict=True):
        (image,) = s.multimodal_inputs["images"]
        assert image.getpixel((0, 0)) == colour
