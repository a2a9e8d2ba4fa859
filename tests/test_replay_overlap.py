"""Replay's cast and fingerprints on a worker thread (``trainer_hooks/replay/_overlap.py``, issue 25
row 6): the report equals the sequential one and the trainer's own rebuild bit for bit, the cast
buffer reused across image sizes changes nothing, one image is in flight at a time, and no thread
outlives a replay, also one that fails."""

from __future__ import annotations

import threading
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

from helpers.replay import make_dump  # noqa: E402

from trainer_hooks import compute_multimodal_train_inputs, load_processor, replay_bundle  # noqa: E402
from trainer_hooks._sample import Sample  # noqa: E402
from trainer_hooks.replay._fingerprint import fingerprints, tensor_bytes, tensor_fingerprint  # noqa: E402
from trainer_hooks.replay._media import MediaReader  # noqa: E402
from trainer_hooks.replay._overlap import PixelWorker  # noqa: E402
from trainer_hooks.replay._plan import open_replay_bundle, plan_replay  # noqa: E402
from trainer_hooks.replay._rebuild import dtype_from_name  # noqa: E402
from trainer_hooks.replay._run import replay_positions  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.processor]


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("replay-pixels")]


def run(dump, dtype: str | None, *, overlap: bool, processor=None):
    bundle = open_replay_bundle(dump)
    try:
        plan = plan_replay(bundle, dtype=dtype)
        proc = processor if processor is not None else load_processor(plan.processor_settings)
        entries, _, _ = replay_positions(plan, plan.positions, bundle=bundle, processor=proc, overlap=overlap)
        return plan, entries
    finally:
        bundle.close()


def trainers_rebuild(dump, plan, processor=None) -> list[tuple[list, int, int]]:
    """Per sample, what the sequential path made of it: (fingerprints, bytes before, bytes after)."""
    bundle = open_replay_bundle(dump)
    try:
        proc = processor if processor is not None else load_processor(plan.processor_settings)
        media = MediaReader(bundle)
        out = []
        before: list[int] = []
        for position, sample in enumerate(bundle.samples(Sample)):
            rebuilt = compute_multimodal_train_inputs(
                [sample], proc, dtype_from_name(plan.dtype), first_position=position, media=media,
                on_sample=lambda _p, _c, b: before.append(b),
            )[0]  # fmt: skip
            out.append((fingerprints(rebuilt) if rebuilt else [], before[-1], tensor_bytes(rebuilt)))
        return out
    finally:
        bundle.close()


def assert_same_as_trainers(entries, expected) -> None:
    assert len(entries) == len(expected)
    for entry, (prints, before, after) in zip(entries, expected, strict=True):
        got = [{k: img[k] for k in ("image", "pixel_values", "image_grid_thw")} for img in entry["images"]]
        assert got == prints
        assert (entry["bytes_before_cast"], entry["bytes_after_cast"]) == (before, after)


@pytest.mark.parametrize("dtype", [None, "fp16", "fp32"])  # None: the dump's bf16
def test_the_worker_path_equals_the_sequential_one_and_the_trainers_rebuild(tmp_path, dtype):
    # Images of two sizes per sample, a text-only sample between: the reused cast buffer grows,
    # is reused for a smaller image, and the fingerprints land on the right image.
    dump = make_dump(tmp_path, 4, text_only=(2,))
    plan, overlapped = run(dump, dtype, overlap=True)
    _, sequential = run(dump, dtype, overlap=False)
    assert overlapped == sequential
    assert [len(e["images"]) for e in overlapped] == [2, 2, 0, 2]
    assert all(img["vision_tokens"] == img["placeholder_tokens"] for e in overlapped for img in e["images"])
    assert_same_as_trainers(overlapped, trainers_rebuild(dump, plan))
    want = {None: "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    assert {img["pixel_values"]["dtype"] for e in overlapped for img in e["images"]} == {want}
    assert worker_threads() == []


def test_a_replay_report_equals_one_made_without_the_worker(tmp_path, monkeypatch):
    import trainer_hooks.replay._run as run_module

    dump = make_dump(tmp_path, 3)
    report = replay_bundle(dump)
    monkeypatch.setattr(run_module, "PixelWorker", lambda overlap=True: PixelWorker(False))
    again = replay_bundle(dump)
    for r in (report, again):
        r["summary"].pop("peak_rss_bytes")
    assert report == again
    assert worker_threads() == []


class ExtraKey:
    """The real processor with one more output: not per-image rows the worker path assumes."""

    def __init__(self, proc, key: str = "extra"):
        self.proc, self.key = proc, key
        self.merge_size, self.image_token_id = proc.merge_size, proc.image_token_id

    def __call__(self, **kw):
        out = self.proc(**kw)
        out[self.key] = torch.ones(3, dtype=torch.float32)
        return out


class ExtraRows(ExtraKey):
    """pixel_values with one row more than image_grid_thw counts."""

    def __call__(self, **kw):
        out = self.proc(**kw)
        out["pixel_values"] = torch.cat([out["pixel_values"], out["pixel_values"][:1] + 1])
        return out


@pytest.mark.parametrize("wrapper", [ExtraKey, ExtraRows])
def test_other_processor_outputs_get_the_trainers_rebuild(tmp_path, wrapper):
    dump = make_dump(tmp_path, 2)
    bundle = open_replay_bundle(dump)
    plan = plan_replay(bundle, dtype=None)
    bundle.close()
    proc = wrapper(load_processor(plan.processor_settings))
    _, entries = run(dump, None, overlap=True, processor=proc)
    assert_same_as_trainers(entries, trainers_rebuild(dump, plan, proc))
    _, sequential = run(dump, None, overlap=False, processor=proc)
    assert entries == sequential
    assert worker_threads() == []


@pytest.mark.parametrize("overlap", [True, False])
def test_the_worker_casts_as_tensor_to_and_drops_the_original(overlap):
    g = torch.Generator().manual_seed(0)
    shapes = [(300, 12), (40, 12), (1000, 12), (0, 12), (7, 5)]  # grow, reuse smaller, grow, empty
    with PixelWorker(overlap) as worker:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for shape in shapes:
                value = torch.randn(*shape, generator=g) * 1e3
                want = value.to(dtype, copy=True)  # not value itself when dtype is float32
                patches = [shape[0] // 2, shape[0] - shape[0] // 2]
                alive = weakref.ref(value)
                rows, nbytes = worker.submit([value], dtype, patches).result()
                del value
                assert alive() is None  # the float32 original is gone once its job is done
                assert rows == [
                    tensor_fingerprint(want[: patches[0]]),
                    tensor_fingerprint(want[patches[0] :]),
                ]
                assert nbytes == want.numel() * want.element_size()
        grid = torch.tensor([[1, 2, 2]])
        rows, nbytes = worker.submit([grid], torch.bfloat16, [1]).result()  # integers: never cast
        assert rows == [tensor_fingerprint(grid)] and rows[0]["dtype"] == "int64" and nbytes == 24
    assert worker_threads() == []


def test_one_image_in_flight(monkeypatch):
    release = threading.Event()
    started = []

    def slow(self, holder, dtype, patches, trim):
        started.append(holder.pop())
        release.wait(10)
        return [], 0

    monkeypatch.setattr(PixelWorker, "_cast_and_fingerprint", slow)
    returned = []
    with PixelWorker(True) as worker:
        worker.submit([1], torch.bfloat16, [])
        t = threading.Thread(target=lambda: returned.append(worker.submit([2], torch.bfloat16, [])))
        t.start()
        t.join(0.3)
        assert started == [1] and returned == []  # the second waits for the first job to finish
        release.set()
        t.join(10)
        assert returned and returned[0].result() == ([], 0) and started == [1, 2]
    assert worker_threads() == []


def test_a_failing_job_or_sample_leaves_no_thread(tmp_path, monkeypatch):
    dump = make_dump(tmp_path, 3)

    def broken(self, value, dtype):
        raise RuntimeError("cast failed")

    with monkeypatch.context() as m:
        m.setattr(PixelWorker, "_cast_into_buffer", broken)
        with pytest.raises(RuntimeError, match="cast failed"):
            replay_bundle(dump)
    assert worker_threads() == []

    calls = []

    class Exploding(ExtraKey):
        def __call__(self, **kw):
            calls.append(1)
            if len(calls) == 3:  # the second sample's first image, the first one's last in flight
                raise KeyboardInterrupt
            return self.proc(**kw)

    bundle = open_replay_bundle(dump)
    plan = plan_replay(bundle, dtype=None)
    bundle.close()
    with pytest.raises(KeyboardInterrupt):
        run(dump, None, overlap=True, processor=Exploding(load_processor(plan.processor_settings)))
    assert worker_threads() == []


def test_a_rebuild_problem_after_a_submitted_image_is_reported_as_before(tmp_path):
    # The second image of each sample fails in the processor: the first one's job is dropped and
    # the sample reports a rebuild problem, with no images, exactly as the sequential path does.
    dump = make_dump(tmp_path, 2)
    bundle = open_replay_bundle(dump)
    plan = plan_replay(bundle, dtype=None)
    bundle.close()
    calls = []

    class SecondFails(ExtraKey):
        def __call__(self, **kw):
            calls.append(1)
            if len(calls) % 2 == 0:
                raise ValueError("no second image")
            return self.proc(**kw)

    proc = load_processor(plan.processor_settings)
    _, overlapped = run(dump, None, overlap=True, processor=SecondFails(proc))
    calls.clear()
    _, sequential = run(dump, None, overlap=False, processor=SecondFails(proc))
    assert overlapped == sequential
    assert [[p["kind"] for p in e["problems"]] for e in overlapped] == [["rebuild"], ["rebuild"]]
    assert all(e["images"] == [] for e in overlapped)
    assert worker_threads() == []
