"""Walk-through of a computer-use (CUA) RL run whose artifacts survive its teardown (``make demo``).

A multimodal RL run keeps its screenshots content-addressed under
``<shared_media_dir>/<run_uuid>/`` and deletes that directory as its last teardown step. Rollout
checkpoints and debug dumps are bundles, so they carry the screenshots they need. This demo plays
a whole run out with the public APIs of ``trainer_hooks`` and ``bundles``:

1. parse real arguments (``trainer_hooks.parse_args``), including the parse-time processor check;
2. run a small fully-async CUA run with the reference driver ``train_async`` and a
   ``FullyAsyncRolloutFn`` whose group generator "acts" on a desktop: it renders 1920x1080
   screenshots with Pillow, stores them with ``trainer_hooks.store_media`` and builds ``Sample``s
   referencing them; rollout checkpoints and debug dumps are written along the way, and the
   driver's teardown releases the run's media directory last;
3. resume in a new run (new run uuid, ``--load`` = the first run's ``--save``): the last checkpoint's
   media are rehydrated into the new run's directory, and the new run trains on them;
4. replay elsewhere: pack a debug dump into one file, "send" it to a colleague, delete the shared
   media directory, and load the dump there with ``load_debug_rollout_data``;
5. ``rollout-bundle inspect`` the checkpoint;
6. look at the colleague's dump: replay it as training would (``trainer_hooks.replay``, when
   transformers is installed), write its HTML report (``rollout-bundle view``), and leave it in
   the ``--dump-details`` layout that Miles' dashboard serves
   (``python -m trainer_hooks.miles.dashboard --dump-details demo-out/dump-details``).

Everything happens under one temporary directory (``$DEMO`` in the output), removed at the end
unless ``--keep`` is given (``make demo DEMO_ARGS=--keep``: the output then names it by its real
path, so that the commands it prints run as printed), except what step 6 writes under
``--out`` (``demo-out/``): the dump unpacked at ``dump-details/rollout_data/<id>.pt``, the replay
report and the HTML page, for a person to open. The commands it prints name the executables of
the interpreter that runs it (``.venv/bin/rollout-bundle`` under ``make demo``: ``.venv`` is not on
PATH unless activated). The first run's debug dumps stay in ``$DEMO/run1/debug``, so that the run
browser it suggests (``rollout-bundle serve $DEMO/run1``) has dumps to show beside the checkpoints.
Each step is a function over one shared ``Demo`` state.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for screenshots.py beside this file

from screenshots import HEIGHT, WIDTH, render_screenshot

import bundles
import trainer_hooks
from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample

TRAJECTORIES = 2  # samples per prompt group: two attempts at the same task
TURNS = 3  # screenshots per trajectory; turn 0 (the task's start screen) is shared by both attempts
STEPS = 3  # rollout steps of the first run; one prompt group per step
TASKS = [
    "Open Settings and turn on dark mode.",
    "Rename report.txt on the desktop to report-final.txt.",
    "Search the browser for 'rollout bundles' and open the first result.",
    "Empty the trash.",
    "Set the clock to 24-hour format.",
    "Pin the terminal to the taskbar.",
]
ACTIONS = ["click(212, 148)", "double_click(960, 540)", "type('dark')", "scroll(0, -3)", "key('enter')"]

SGLANG_CONFIG = """\
sglang:
  - name: actor
    model_path: Qwen/Qwen2.5-VL-3B-Instruct
    server_groups:
      - {worker_type: regular, num_gpus: 4, num_gpus_per_engine: 2}
      - worker_type: regular
        num_gpus: 2
        num_gpus_per_engine: 1
        overrides: {mem_fraction_static: 0.7%s}
"""
DISAGREEING_OVERRIDE = ", mm_process_config: {image: {max_pixels: 1003520}}"


@dataclass
class Demo:
    root: Path
    t0: float = field(default_factory=time.perf_counter)
    base_argv: list[str] = field(default_factory=list)
    args1: argparse.Namespace | None = None
    args2: argparse.Namespace | None = None
    # What the first run's generator stored: digest -> size, and (group, sample index) -> digests.
    stored: dict[str, int] = field(default_factory=dict)
    images_of: dict[tuple[Any, Any], list[str]] = field(default_factory=dict)
    stored_lock: threading.Lock = field(default_factory=threading.Lock)
    save_block_ms: list[float] = field(default_factory=list)
    last_checkpoint: Path | None = None
    received_dump: Path | None = None  # the packed debug dump as the colleague received it
    out: Path = field(default_factory=lambda: Path("demo-out").resolve())
    report: Path | None = None
    keep: bool = False  # --keep: $DEMO is left in place at exit
    timings: dict[str, float] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def shared(self) -> Path:
        return self.root / "shared-media"

    def show(self, text: object) -> str:
        """``text`` as the walk-through prints it: the temporary root as ``$DEMO`` (unless --keep keeps
        it: then by its path, which the printed commands can use), ``--out`` relative to the working
        directory when it is inside it, run uuids cut to 8 characters, and the unique part of an
        unpacked cache directory's name cut (``.rollout_2.rbundle.….unpacked``)."""
        out = str(text) if self.keep else str(text).replace(str(self.root), "$DEMO")
        if self.out.is_relative_to(Path.cwd()):
            out = out.replace(str(self.out), os.path.relpath(self.out))
        for args in (self.args1, self.args2):
            if args is not None:
                out = out.replace(args.run_uuid, args.run_uuid[:8] + "…")
        return re.sub(r"\.[0-9]+-[0-9]+\.unpacked", ".….unpacked", out)


def command(name: str) -> str:
    """How a reader runs ``name`` (``rollout-bundle``, or ``python``): the executable beside the
    interpreter running the demo (``.venv/bin/rollout-bundle`` under ``make demo``, relative to the
    working directory when inside it), since that environment is on PATH only when activated."""
    exe = Path(sys.executable) if name == "python" else Path(sys.executable).parent / name
    if not exe.exists():  # not installed as a script here: through the interpreter
        return f"{command('python')} -m trainer_hooks.cli" if name == "rollout-bundle" else name
    return os.path.relpath(exe) if exe.is_relative_to(Path.cwd()) else str(exe)


def say(d: Demo, text: str) -> None:
    """One line (or several) of the current step, indented under its heading."""
    print(textwrap.indent(d.show(text), "  ", lambda line: True))


class SayHandler(logging.Handler):
    """Log records of ``trainer_hooks`` and ``bundles`` as lines of the step that emitted them.

    Without it, Python's last-resort handler writes a warning's bare message to stderr, out of the
    walk-through's indentation and with the temporary directory's real path in it."""

    def __init__(self, d: Demo) -> None:
        super().__init__(logging.INFO)
        self.d = d

    def emit(self, record: logging.LogRecord) -> None:
        say(
            self.d,
            f"(logged by {record.name.split('._')[0]}, {record.levelname.lower()}) {record.getMessage()}",
        )


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def sha256_of(path: str | os.PathLike[str]) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


# Qwen2-VL's vision tokens: 14-pixel patches, merged 2x2 into one token; the image is resized to
# multiples of 28 pixels with its area within [min_pixels, max_pixels] (the processor's smart_resize).
VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653
FACTOR, MIN_PIXELS = 28, 3136


def max_pixels(args: argparse.Namespace) -> int:
    config = getattr(args, "sglang_mm_process_config", None) or {}
    return int((config.get("image") or {}).get("max_pixels", 12845056))


def vision_tokens(width: int, height: int, max_px: int) -> int:
    h, w = max(FACTOR, round(height / FACTOR) * FACTOR), max(FACTOR, round(width / FACTOR) * FACTOR)
    if h * w > max_px:
        beta = math.sqrt(height * width / max_px)
        h, w = math.floor(height / beta / FACTOR) * FACTOR, math.floor(width / beta / FACTOR) * FACTOR
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / FACTOR) * FACTOR, math.ceil(width * beta / FACTOR) * FACTOR
    return (h // 14) * (w // 14) // 4


# -- the "environment": a desktop that answers actions with screenshots ------------------------------


class Desktop:
    """The group generator of a CUA run: plays every trajectory of a prompt group on a desktop.

    Each turn's screenshot is rendered (Pillow, 1920x1080, ~1 MB PNG) and stored with
    ``trainer_hooks.store_media``, which puts it, content-addressed, in the run's media directory;
    the samples hold the returned ``MediaRef``s. Tasks listed in ``stall`` never finish (an app
    that hangs): they are still in flight when a checkpoint is taken, and are cancelled at teardown.
    """

    def __init__(self, d: Demo | None, stall: frozenset[int] = frozenset()) -> None:
        self.d = d
        self.stall = stall
        self.stalled = 0  # groups waiting in the stall right now

    def shoot(self, args: argparse.Namespace, seed: int) -> bundles.MediaRef:
        ref = trainer_hooks.store_media(args, render_screenshot(seed))
        if self.d is not None:
            with self.d.stored_lock:
                self.d.stored[ref.digest] = ref.size
        return ref

    async def __call__(self, args: argparse.Namespace, group: list[Sample]) -> list[Sample]:
        task = group[0].group_index
        assert task is not None
        if task in self.stall:
            self.stalled += 1
            try:
                await asyncio.Event().wait()  # until the worker is stopped at teardown
            finally:
                self.stalled -= 1
        start = await asyncio.to_thread(self.shoot, args, 1000 * task)
        for j, sample in enumerate(group):
            shots = [start]
            for turn in range(1, TURNS):
                shots.append(await asyncio.to_thread(self.shoot, args, 1000 * task + 10 * j + turn))
            actions = [ACTIONS[(task + j + t) % len(ACTIONS)] for t in range(TURNS)]
            # Token space: each screenshot is <|vision_start|>, one <|image_pad|> per vision token
            # (as many as the engines' processor makes of a 1920x1080 image), <|vision_end|>. The
            # samples carry the references only: the trainer rebuilds the tensors (replay checks both).
            prompt = [1000 + (7 * i + task) % 997 for i in range(96)]  # ordinary text ids, no specials
            pads = [VISION_START, *[IMAGE_PAD] * vision_tokens(WIDTH, HEIGHT, max_pixels(args)), VISION_END]
            response = [1000 + (5 * i + j) % 991 for i in range(16 * TURNS)]
            sample.tokens = prompt + pads * len(shots) + response
            sample.response = "".join(f"<tool_call>{a}</tool_call>" for a in actions)
            sample.response_length = len(response)
            sample.loss_mask = [1] * sample.response_length
            sample.rollout_log_probs = [-0.05 - 0.01 * (i % 17) for i in range(sample.response_length)]
            sample.multimodal_inputs = {"images": shots}
            sample.reward = 1.0 if (task + j) % 2 == 0 else 0.0
            sample.metadata = {**sample.metadata, "actions": actions, "screen": [WIDTH, HEIGHT]}
            sample.status = Sample.Status.COMPLETED
            if self.d is not None:
                with self.d.stored_lock:
                    self.d.images_of[(task, sample.index)] = [s.digest for s in shots]
        return group


def prompt_groups(task_ids: range) -> list[list[Sample]]:
    """The data source's prompt groups: one per task, ``TRAJECTORIES`` samples each."""
    return [
        [
            Sample(
                group_index=t,
                index=TRAJECTORIES * t + j,
                prompt=f"<|im_start|>user\n{TASKS[t % len(TASKS)]}<|im_end|>",
                label=None,
                metadata={"task": t, "attempt": j},
            )
            for j in range(TRAJECTORIES)
        ]
        for t in task_ids
    ]


class DesktopRollout(FullyAsyncRolloutFn):
    """The rollout manager: ``FullyAsyncRolloutFn`` plus Miles' per-step debug dump.

    ``save`` is wrapped only to time how long it blocks the caller, and to let the worker settle
    first (demo only, so that the printed counts don't depend on thread timing).
    """

    def __init__(self, args: argparse.Namespace, source: ListDataSource, desktop: Desktop, d: Demo) -> None:
        super().__init__(args, source, desktop, max_in_flight=2, max_buffered=3)
        self.source, self.desktop, self.d = source, desktop, d

    def generate(self, rollout_id: int) -> list[list[Sample]]:
        groups = super().generate(rollout_id)
        # As Miles' RolloutManager does after each generate; a no-op without --save-debug-rollout-data.
        trainer_hooks.save_debug_rollout_data(
            self.args,
            groups,
            rollout_id,
            evaluation=False,
            metadata={"env": "desktop-sim", "step": rollout_id},
        )
        return groups

    def settle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.get_metrics()
            in_flight, buffered = m["rollout/in_flight"], m["buffer/size"]
            budget_full = in_flight + buffered >= self.max_buffered or len(self.source) == 0
            if budget_full and in_flight == self.desktop.stalled:
                return
            time.sleep(0.01)
        raise TimeoutError("the rollout worker did not settle")

    def save(self, rollout_id: int) -> Any:
        self.settle()
        t = time.perf_counter()
        future = super().save(rollout_id)
        self.d.save_block_ms.append((time.perf_counter() - t) * 1e3)
        return future


class DesktopTrainer:
    """The trainer: reads every screenshot a sample references, as building pixel values would."""

    def __init__(self, args: argparse.Namespace, d: Demo, sweep_at: int | None = None) -> None:
        self.args, self.d, self.sweep_at = args, d, sweep_at
        self.groups_trained: list[int | None] = []
        self.images_read = 0
        self.sweep: list[trainer_hooks.SweepEntry] = []

    def train(self, rollout_id: int, groups: list[list[Sample]]) -> None:
        for group in groups:
            for sample in group:
                for ref in (sample.multimodal_inputs or {})["images"]:
                    if sha256_of(ref.path) != ref.digest:
                        raise SystemExit(f"{ref.path}: bytes differ from {ref.digest}")
                    self.images_read += 1
            self.groups_trained.append(group[0].group_index)
        if rollout_id == self.sweep_at:
            # An operator runs `rollout-bundle sweep --delete` on the shared root while this run lives.
            self.sweep = trainer_hooks.sweep_run_media(
                self.args.shared_media_dir, older_than=3600, delete=True
            )

    def save_model(self, rollout_id: int) -> None:
        pass

    def update_weights(self) -> None:
        pass

    def close(self) -> None:
        pass


# -- steps ----------------------------------------------------------------------------------------------


def step_parse_args(d: Demo) -> None:
    """Real arguments, with Miles' option names; the processor check runs while parsing."""
    config = d.root / "sglang.yaml"
    config.write_text(SGLANG_CONFIG % "")
    d.base_argv = [
        "--shared-media-dir", str(d.shared),
        "--bf16",
        "--rollout-batch-size", "1",
        "--enable-token-space-processor",
        "--sglang-config", str(config),
        "--sglang-image-processor-backend", "pil",
        "--sglang-mm-process-config", '{"image": {"max_pixels": 2073600}}',
    ]  # fmt: skip
    d.args1 = trainer_hooks.parse_args(
        [
            *d.base_argv,
            "--save", str(d.root / "run1" / "ckpt"),
            "--save-interval", "1",
            "--keep-rollout-checkpoints", "2",
            "--save-debug-rollout-data", str(d.root / "run1" / "debug" / "rollout_{rollout_id}.bundle"),
            "--num-rollout", str(STEPS),
        ]
    )  # fmt: skip
    a = d.args1
    say(d, f"run {a.run_uuid}: media in {trainer_hooks.run_media_dir(a)}")
    say(d, f"--save {a.save}  (--keep-rollout-checkpoints {a.keep_rollout_checkpoints})")
    say(d, f"--save-debug-rollout-data {a.save_debug_rollout_data}")
    proc = a.rollout_processor_args
    say(
        d,
        f"engine groups agree on the processor: {proc.model_path}, backend {proc.image_processor_backend!r}, "
        f"{proc.mm_process_config} ({len(proc.engine_groups)} groups)",
    )
    # What parse time refuses: engine groups that disagree, and external engines.
    bad_config = d.root / "sglang-bad.yaml"
    bad_config.write_text(SGLANG_CONFIG % DISAGREEING_OVERRIDE)
    bad_argvs = [
        [*d.base_argv, "--sglang-config", str(bad_config)],
        [*d.base_argv, "--rollout-external-engine-addrs", "10.0.0.7:30000"],
    ]
    for argv in bad_argvs:
        try:
            trainer_hooks.parse_args(argv)
        except ValueError as e:
            say(d, textwrap.fill(d.show(f"refused: {e}"), width=104, subsequent_indent="    "))
        else:
            raise SystemExit(f"parse_args accepted {argv}")


def step_first_run(d: Demo) -> None:
    """A fully-async run with the reference driver; checkpoints and dumps along the way."""
    a = d.args1
    assert a is not None
    # A directory left behind by a run that crashed hours ago (no lease, nothing changed for 2 h).
    # Made as a run makes it (store_media writes the run marker sweep looks for), then aged.
    dead_run = argparse.Namespace(shared_media_dir=str(d.shared), run_uuid="0c7a5e1f4b2d4e6f8a9b1c2d3e4f5a6b")
    trainer_hooks.store_media(dead_run, b"\0" * 300_000, ".png")
    crashed = d.shared / dead_run.run_uuid
    for p in [*crashed.iterdir(), crashed]:
        os.utime(p, (time.time() - 7200, time.time() - 7200))

    desktop = Desktop(d, stall=frozenset({STEPS + 2}))  # the last task hangs: in flight at the last save
    source = ListDataSource(prompt_groups(range(STEPS + 3)))
    trainers: list[DesktopTrainer] = []

    def make_trainer(args: argparse.Namespace) -> DesktopTrainer:
        trainers.append(DesktopTrainer(args, d, sweep_at=0))
        return trainers[-1]

    run_dir = trainer_hooks.run_media_dir(a)
    assert run_dir is not None
    t = time.perf_counter()
    report = trainer_hooks.train_async(
        a,
        create_rollout_manager=lambda args: DesktopRollout(args, source, desktop, d),
        create_actor=make_trainer,
    )
    d.timings["run 1"] = time.perf_counter() - t
    trainer = trainers[0]
    stored_bytes = sum(d.stored.values())
    d.numbers.update(screenshots=len(d.stored), stored_bytes=stored_bytes)

    for e in trainer.sweep:
        verdict = "deleted" if e.deleted else "kept"
        say(d, f"sweep during the run: {e.run_id[:8]}… {e.state} ({e.reason.split(';')[0]}): {verdict}")
    if {(e.run_id, e.deleted) for e in trainer.sweep} != {(crashed.name, True), (a.run_uuid, False)}:
        raise SystemExit(
            f"sweep: expected the crashed dir deleted and the live run kept, found {trainer.sweep}"
        )
    say(
        d,
        f"trained rollouts {report.trained_rollout_ids} on groups {trainer.groups_trained} (in completion order); "
        f"{trainer.images_read} screenshot reads checked against their digests",
    )
    say(d, f"stored {len(d.stored)} screenshots ({mib(stored_bytes)}) in {run_dir}")
    ckpt_root = Path(a.save) / "rollout"
    kept = sorted(p.name for p in ckpt_root.iterdir() if bundles.is_bundle(p))
    say(d, save_cost(d, [ckpt_root / name for name in kept]))
    dumps = sorted(p.name for p in Path(a.save_debug_rollout_data).parent.iterdir() if bundles.is_bundle(p))
    say(d, f"checkpoints kept: {', '.join(kept)} (of {STEPS} saved); debug dumps: {', '.join(dumps)}")
    d.last_checkpoint = ckpt_root / kept[-1]
    say(d, "teardown: " + " -> ".join(report.teardown))
    if run_dir.exists() or report.teardown[-1] != "release_run_media":
        raise SystemExit(f"{run_dir}: expected release_run_media to run last and remove it")
    freed = report.media_bytes_freed or 0
    say(
        d,
        f"release_run_media ran last; {run_dir} is gone (exists: {run_dir.exists()}). It freed {mib(freed)}: the "
        f"checkpoints and dumps hard-link the other {mib(stored_bytes - freed)} of screenshots",
    )


def save_cost(d: Demo, checkpoints: list[Path]) -> str:
    """What ``save()`` cost the caller: the demo's own clock around each call, and the split each
    checkpoint records in its meta (``save_telemetry``): the snapshot of the groups, and the wait
    for the rollout journal to be durable (one fsync barrier). README.md quotes this line."""
    telemetry = [bundles.open_bundle(p, verify="none").meta["save_telemetry"] for p in checkpoints]
    snapshot_ms = max((t["blocking_s"] - t["journal_barrier_s"]) * 1e3 for t in telemetry)
    d.numbers.update(save_ms=list(d.save_block_ms), snapshot_ms=snapshot_ms)
    calls = ", ".join(f"{ms:.1f}" for ms in d.save_block_ms)
    return (
        f"save() blocked the caller {calls} ms ({len(d.save_block_ms)} saves): the snapshot of the groups "
        f"{snapshot_ms:.1f} ms at most, the rest waiting for the rollout journal's fsync; the bundles "
        "are written in the background"
    )


def step_resume(d: Demo) -> None:
    """A new run loads the last checkpoint: its media come back into the *new* run's directory."""
    assert d.args1 is not None and d.last_checkpoint is not None
    last_id = int(d.last_checkpoint.name.rsplit("_", 1)[1])
    d.args2 = trainer_hooks.parse_args(
        [
            *d.base_argv,
            "--load", d.args1.save,
            "--start-rollout-id", str(last_id + 1),
            "--num-rollout", str(last_id + 4),
            # This run trains only what the checkpoint holds (its data source is empty), so its
            # dataset differs from the checkpoint's on purpose: accepted by name (docs/RESUME.md).
            "--resume-accept-changes", "dataset",
        ]
    )  # fmt: skip
    a = d.args2
    run_dir = trainer_hooks.run_media_dir(a)
    assert run_dir is not None
    say(d, f"new run {a.run_uuid} (--load {a.load})")
    t = time.perf_counter()
    ckpt = trainer_hooks.read_rollout_checkpoint(a, last_id)
    d.timings["load"] = time.perf_counter() - t
    pending = [s for g in ckpt.pending_groups for s in g]
    completed = [s for g in ckpt.completed_groups for s in g]
    say(
        d,
        f"{d.last_checkpoint.name}: {plural(len(ckpt.pending_groups), 'pending group')} ({len(pending)} prompts, "
        f"resubmitted first), {plural(len(ckpt.completed_groups), 'completed group')} ({len(completed)} samples) "
        f"in {d.timings['load'] * 1e3:.0f} ms",
    )
    checked = 0
    for s in completed:
        refs = (s.multimodal_inputs or {})["images"]
        if [r.digest for r in refs] != d.images_of[(s.group_index, s.index)]:
            raise SystemExit(f"sample {s.index}: references differ from what the first run stored")
        for r in refs:
            if not Path(r.path).is_relative_to(run_dir) or sha256_of(r.path) != r.digest:
                raise SystemExit(f"{r.path}: not inside {run_dir} with the original bytes")
            checked += 1
    files = [p for p in run_dir.iterdir() if not p.name.startswith(".")]
    linked = sum(p.stat().st_nlink > 1 for p in files)
    say(
        d,
        f"{checked}/{checked} image references resolve inside {run_dir} with the original bytes "
        f"({len(files)} files rehydrated, {linked} of them hard links into the checkpoint)",
    )

    # Keep training from there: the pending group is regenerated, the completed ones train as they are.
    trainers: list[DesktopTrainer] = []

    def make_rollout(args: argparse.Namespace) -> DesktopRollout:
        fn = DesktopRollout(args, ListDataSource([]), Desktop(None), d)
        fn.load(last_id)  # as Miles' rollout manager does with --load
        return fn

    def make_trainer(args: argparse.Namespace) -> DesktopTrainer:
        trainers.append(DesktopTrainer(args, d))
        return trainers[-1]

    t = time.perf_counter()
    report = trainer_hooks.train_async(a, create_rollout_manager=make_rollout, create_actor=make_trainer)
    d.timings["run 2"] = time.perf_counter() - t
    say(
        d,
        f"trained rollouts {report.trained_rollout_ids} on groups {trainers[0].groups_trained}; "
        f"its teardown removed {run_dir} (exists: {run_dir.exists()})",
    )
    bundles.open_bundle(d.last_checkpoint, verify="full")
    say(d, f"{d.last_checkpoint.name} is untouched: it still opens with verify='full'")


def step_replay(d: Demo) -> None:
    """Pack a debug dump into one file, hand it over, delete the shared media, replay it there."""
    a = d.args1
    assert a is not None
    rollout_id = STEPS - 1
    dump = Path(a.save_debug_rollout_data.format(rollout_id=rollout_id))
    outbox = d.root / "outbox" / f"rollout_{rollout_id}{bundles.PACK_SUFFIX}"
    bundles.pack_bundle(dump, outbox)
    colleague = d.root / "colleague"
    colleague.mkdir()
    sent = Path(shutil.copy(outbox, colleague / outbox.name))
    d.received_dump = sent
    say(d, f"packed {dump.name} into one file, {mib(sent.stat().st_size)}; copied to {sent}")
    # Nothing of the run's screenshots is left but what its bundles hold: the colleague's copy is
    # all the replay has. The run's own dumps stay, for the run browser (step 6).
    for path in (d.shared, outbox.parent):
        shutil.rmtree(path)
    say(d, f"deleted {d.shared} and the outbox (the run's own dumps stay in {dump.parent}, for serve)")

    replay = trainer_hooks.parse_args(
        ["--rollout-batch-size", "1", "--load-debug-rollout-data", str(colleague / f"rollout_{{rollout_id}}{bundles.PACK_SUFFIX}"),
         "--bundle-verify", "full"]
    )  # fmt: skip
    t = time.perf_counter()
    samples, metadata = trainer_hooks.load_debug_rollout_data(replay, rollout_id)
    d.timings["replay load"] = time.perf_counter() - t
    from PIL import Image

    opened = 0
    for s in samples:
        refs = (s.multimodal_inputs or {})["images"]
        if [r.digest for r in refs] != d.images_of[(s.group_index, s.index)]:
            raise SystemExit(f"sample {s.index}: references differ from what the first run stored")
        for r in refs:
            if sha256_of(r.path) != r.digest:
                raise SystemExit(f"{r.path}: bytes differ from {r.digest}")
            with Image.open(r.path) as im:
                im.load()
                if im.size != (WIDTH, HEIGHT):
                    raise SystemExit(f"{r.path}: expected {WIDTH}x{HEIGHT}, found {im.size}")
            opened += 1
    where = Path((samples[0].multimodal_inputs or {})["images"][0].path).parents[1]
    say(
        d,
        f"load_debug_rollout_data: {len(samples)} samples, metadata {metadata}, unpacked and fully verified "
        f"in {d.timings['replay load'] * 1e3:.0f} ms into {where}",
    )
    say(
        d, f"{opened}/{opened} images open with Pillow at {WIDTH}x{HEIGHT}, bytes as the first run wrote them"
    )


def step_inspect(d: Demo) -> None:
    """``rollout-bundle inspect`` on the last checkpoint (the CLI, through this interpreter), its
    meta cut down to the fields a resume reads; the command prints all of it."""
    assert d.last_checkpoint is not None
    cmd = [sys.executable, "-m", "trainer_hooks.cli", "inspect", "--json", str(d.last_checkpoint)]
    info = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    meta, journal = info["meta"], info.get("journal") or {}
    say(d, f"$ {command('rollout-bundle')} inspect --json {d.last_checkpoint}   (a few of its fields)")
    ratio = f"{info['dedup_ratio']:.2f}x" if info["dedup_ratio"] else "n/a"
    proc = meta.get("processor") or {}
    dataset = (meta.get("fingerprint") or {}).get("dataset")
    lines = [
        ("kind", f"{info['kind']} (format_version {info['format_version']}), {plural(info['samples'], 'sample')}"),
        ("media", f"{plural(info['media_files'], 'file')}, {mib(info['media_bytes'])}, "
                  f"{info['media_references']} references (dedup ratio {ratio})"),
        ("rollout_id", f"{meta['rollout_id']} of run {meta['run_uuid']}, training dtype {meta['training_dtype']}"),
        ("groups", f"pending {meta['pending_group_ids']} (resubmitted on resume), completed "
                   f"{meta['completed_group_ids']} (back into the buffer)"),
        ("processor", f"{proc.get('model_path')}, backend {proc.get('image_processor_backend')!r}, "
                      f"{proc.get('mm_process_config')}"),
        ("fingerprint", f"{', '.join(sorted(meta.get('fingerprint') or {}))} (dataset: {dataset})"),
        ("save", f"blocked {meta['save_telemetry']['blocking_s'] * 1e3:.1f} ms, of which the journal's fsync "
                 f"{meta['save_telemetry']['journal_barrier_s'] * 1e3:.1f} ms"),
    ]  # fmt: skip
    for lineage in journal.get("lineages", []):
        lines.append(("journal", f"{plural(lineage['records'], 'record')} beside it in {journal['path']}, "
                                 f"durable up to seq {lineage['synced_seq']}"))  # fmt: skip
    say(d, "\n".join(f"  {k:<12} {v}" for k, v in lines))
    say(
        d,
        f"  the rest ({plural(len(meta), 'meta key')} in all): {command('rollout-bundle')} inspect {d.last_checkpoint}",
    )
    if not d.keep:  # the command names a directory removed at exit (issue 30, item 21)
        say(
            d,
            "  ($DEMO is removed when the demo ends; make demo DEMO_ARGS=--keep keeps it for such commands)",
        )


def step_view(d: Demo) -> None:
    """Replay the colleague's dump (if transformers is installed) and write its HTML report under
    ``--out``, with the dump unpacked beside it so the thumbnails link to the full-size screenshots."""
    from trainer_hooks.view import write_html_report

    assert d.received_dump is not None
    name = d.received_dump.name.removesuffix(bundles.PACK_SUFFIX)
    rollout_id = int(name.rsplit("_", 1)[1])
    # Where a Miles fork writes its dumps for Miles' dashboard (--save-debug-rollout-data
    # DIR/rollout_data/{rollout_id}.pt): the page links into it, and the dashboard serves it.
    details = d.out / "dump-details"
    (details / "rollout_data").mkdir(parents=True, exist_ok=True)
    dump = bundles.unpack_bundle(
        d.received_dump, details / "rollout_data" / f"{rollout_id}.pt", overwrite=True
    ).path
    replay_report = None
    replay_path = d.out / f"{name}.replay.json"
    try:
        import transformers  # noqa: F401

        from trainer_hooks.replay import replay_bundle
    except ImportError:
        say(d, "replay skipped: it needs transformers (pip install 'rollout-bundles[replay]')")
    else:
        t = time.perf_counter()
        replay_report = replay_bundle(dump)
        s = replay_report["summary"]
        problems = ", ".join(f"{k} {n}" for k, n in s["problems"].items()) or "none"
        replay_path.write_text(json.dumps(replay_report, indent=1) + "\n")
        say(
            d,
            f"replay_bundle: {s['samples']} samples, {s['images']} images, {s['vision_tokens']} vision tokens, "
            f"cast to {replay_report['dtype']}, problems: {problems} ({time.perf_counter() - t:.1f} s) "
            f"-> {replay_path}",
        )
    written = write_html_report(dump, d.out / f"{name}.html", replay=replay_path if replay_report else None)
    d.report = written.path
    search = f" and its search page {written.search}" if written.search else ""
    say(
        d,
        f"rollout-bundle view: {plural(written.samples, 'sample')}, {plural(written.images, 'screenshot')}, "
        f"{mib(written.bytes)} -> {written.path}{search}",
    )
    say(
        d,
        f"the dump in Miles' --dump-details layout, rollout_data/{rollout_id}.pt: serve Miles' dashboard on it "
        f"(a Miles checkout on PYTHONPATH, pip install 'rollout-bundles[dashboard]') with\n"
        f"    {command('python')} -m trainer_hooks.miles.dashboard --dump-details {details}",
    )
    # The run browser on the run itself: its checkpoints and dumps, with trends across steps.
    say(
        d,
        "browse the whole run, its checkpoints with trends across steps (pip install 'rollout-bundles[serve]'), "
        f"with\n    {command('rollout-bundle')} serve {d.show(str(d.root / 'run1'))}",
    )
    if not d.keep:  # the command names a directory removed at exit (issue 30, item 21)
        say(
            d,
            "  ($DEMO is removed when the demo ends; make demo DEMO_ARGS=--keep keeps it for such commands)",
        )


STEPS_: list[tuple[str, Callable[[Demo], None]]] = [
    ("parse arguments", step_parse_args),
    (f"fully-async CUA run: {STEPS} steps x {TRAJECTORIES} trajectories x {TURNS} turns", step_first_run),
    ("resume in a new run from the last checkpoint", step_resume),
    ("replay a debug dump on another machine", step_replay),
    ("inspect the checkpoint", step_inspect),
    ("look at the dump: replay it and write its HTML report", step_view),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory ($DEMO) and print its path, to run the printed commands on it",
    )
    parser.add_argument(
        "--out",
        default="demo-out",
        help="where the last step writes the dump, replay and HTML report (demo-out)",
    )
    ns = parser.parse_args(argv)
    d = Demo(
        root=Path(tempfile.mkdtemp(prefix="rollout-bundles-demo-")).resolve(),
        out=Path(ns.out).resolve(),
        keep=ns.keep,
    )
    # The library's log records (a resume accepting a changed dataset warns) are lines of the step.
    handler = SayHandler(d)
    loggers = [logging.getLogger(name) for name in ("trainer_hooks", "bundles")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        for i, (title, step) in enumerate(STEPS_, 1):
            print(f"[{i}/{len(STEPS_)}] {title}")
            step(d)
    finally:
        if ns.keep:
            print(f"kept the demo's directory (the commands above run on it): {d.root}")
        else:
            shutil.rmtree(d.root, ignore_errors=True)
        for logger in loggers:
            logger.removeHandler(handler)
            logger.propagate = True
    print(
        f"demo OK in {time.perf_counter() - d.t0:.1f} s: {d.numbers['screenshots']} screenshots "
        f"({mib(d.numbers['stored_bytes'])}) rendered, 2 runs, 1 replay"
    )
    print(f"open the report of the last debug dump: {d.show(d.report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
