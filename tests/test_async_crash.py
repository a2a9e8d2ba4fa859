"""Crash tests of the asynchronous driver's resume (issue 30, item 1): ``train_async`` over
``FullyAsyncRolloutFn``, as the README runs it, killed with SIGKILL before, during and after
``save(N)`` while the rollout of step N+1 is in flight or already drained, resumed as the README
says (a new run, ``--start-rollout-id N+1``, ``fn.load(N)``), finished, and checked.

``train_async`` drains step N+1 while step N trains, so at ``save(N)`` the groups of N+1 have
often left the buffer and are in no saved weights: before the fix a resume lost them (and the
resumed run then died with ``drain: expected 2 completed groups, found 0``).

The runs are forked by one server process (``helpers.crash.ForkServer``). A run restores the step
in its ``trainer_step`` file, the trainer's checkpoint: written durably once the weights of N are
saved and ``save(N)`` has returned (its cut and the journal barrier done; the bundle may still be
being written). It logs every trained sample to an append-only event log, and at each save whether
step N+1 was drained already. Kill points, from a seed (``ASYNC_CRASH_SEED``; every kind once, then
seeded ones up to ``ASYNC_CRASH_POINTS``, default 22, plus 9 on a store):

* before save(N): training step N, the weights being saved (``async.train``, ``async.save_model``,
  ``async.save``);
* during save(N): its journal barrier's fsync, the cut taken but the trainer's step not yet
  written, the bundle's shard, manifest and commit (``journal.fsync``, ``async.saved``,
  ``write.shard``, ``write.manifest``, ``commit.before-rename``, ``commit.after-rename``), the
  trainer's step written with the bundle not yet committed (``async.marked``);
* after save(N): committed (``async.committed``), retention and the journal's compaction, step N+1
  training; a timer; and a kill during the resume itself (a third run finishes).

After each trial every sample of the dataset was trained exactly once in the surviving lineage
(a killed run's steps after the step its successor restored are dropped: their weights are
gone), every trained image verified, and the last run finished. Across the suite, kills at
saves with step N+1 already drained and with it still in flight must both have happened.
"""

from __future__ import annotations

import json
import os
import random
import signal
import textwrap
from pathlib import Path
from typing import Any

from helpers.crash import ForkServer

SEED = int(os.environ.get("ASYNC_CRASH_SEED", "20261204"))
POINTS = int(os.environ.get("ASYNC_CRASH_POINTS", "22"))
STORE_POINTS = int(os.environ.get("ASYNC_CRASH_STORE_POINTS", "9"))
INTERVAL = 0.05
GROUPS = 24
SIZE = 2
BATCH = 2
TRIAL_TIMEOUT_S = 60
# Generation faster than training (step N+1 drained before save(N)) or slower (still in flight).
MODES = {
    "ahead": {"gen_delay": 0.002, "train_s": 0.01, "in_flight": 4, "buffered": 8},
    "behind": {"gen_delay": 0.03, "train_s": 0.005, "in_flight": 2, "buffered": 2},
}
# On a store a checkpoint takes longer to commit than two such steps: a kill would mostly find
# the previous one and resume through the journal. Slower steps let kills land after save(N)
# committed, with N+1 drained before it (the case that lost groups).
STORE_MODES = {
    "ahead": {**MODES["ahead"], "train_s": 0.06},
    "behind": {**MODES["behind"], "gen_delay": 0.12, "train_s": 0.04},
}

CHILD = textwrap.dedent(
    """
    import asyncio, hashlib, random
    from bundles import BundleNotFoundError
    from bundles.support import arm_kill, atomic_write, fault_point
    from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample, parse_args, store_media, train_async
    from trainer_hooks.testing import png_bytes

    def child(cfg):
        arm_kill(cfg.get("point"))
        d = cfg["dir"]
        log = os.open(os.path.join(d, "events.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        attempt = cfg["attempt"]
        def event(**kw):
            os.write(log, (json.dumps({{"attempt": attempt, "t": time.time(), **kw}}) + "\\n").encode())
        step_file = os.path.join(d, "trainer_step")
        restored = int(open(step_file).read()) if os.path.exists(step_file) else None
        save = cfg.get("save") or os.path.join(d, "ckpt")
        args = parse_args([
            "--rollout-batch-size", str(cfg["batch"]), "--shared-media-dir", os.path.join(d, "shared"),
            "--run-uuid", f"run-{{attempt}}", "--save", save, "--load", save,
            "--num-rollout", str(cfg["steps"]), "--save-interval", "2",
            "--start-rollout-id", str(restored + 1 if restored is not None else 0),
            "--rollout-journal-interval", str(cfg["interval"]), "--keep-rollout-checkpoints", "2",
        ])
        rng = random.Random(cfg["seed"] * 1000 + attempt)
        groups = [[Sample(group_index=g, index=g * cfg["size"] + i, prompt=f"p{{g}}") for i in range(cfg["size"])]
                  for g in range(cfg["groups"])]

        async def generate_group(args, group):
            await asyncio.sleep(rng.uniform(0.5, 1.5) * cfg["gen_delay"])
            for s in group:
                s.multimodal_inputs = {{"images": [store_media(args, png_bytes(8, 8, (s.index % 256, 17, 99)))]}}
                s.tokens = list(range(100)) + [s.index]
                s.reward = float(s.index)
                s.status = Sample.Status.COMPLETED
            return group

        drained = set()

        class Manager(FullyAsyncRolloutFn):
            def generate(self, rollout_id):
                batch = super().generate(rollout_id)
                drained.add(rollout_id)
                return batch

            def save(self, rollout_id):
                fault_point("async.save", rollout_id)
                event(kind="save", step=rollout_id, next_drained=rollout_id + 1 in drained)
                fut = super().save(rollout_id)
                fault_point("async.saved", rollout_id)
                # The weights of N are saved and save(N) returned: the trainer's checkpoint is complete.
                atomic_write(step_file, str(rollout_id), durable=True)
                fault_point("async.marked", rollout_id)
                fut.add_done_callback(lambda f: fault_point("async.committed", rollout_id))
                return fut

        class Trainer:
            def __init__(self, args):
                pass

            def train(self, rollout_id, batch):
                fault_point("async.train", rollout_id)
                bad = []
                for g in batch:
                    for s in g:
                        (img,) = s.multimodal_inputs["images"]
                        if "sha256:" + hashlib.sha256(open(img.path, "rb").read()).hexdigest() != img.digest:
                            bad.append(s.index)
                event(kind="trained", step=rollout_id, indices=[s.index for g in batch for s in g], bad=bad)
                time.sleep(cfg["train_s"])

            def save_model(self, rollout_id):
                fault_point("async.save_model", rollout_id)

            def update_weights(self):
                pass

        fn = Manager(args, ListDataSource(groups), generate_group, max_in_flight=cfg["in_flight"],
                     max_buffered=cfg["buffered"])
        try:
            fn.load(restored if restored is not None else -1)
        except BundleNotFoundError:
            pass  # nothing to resume from: a fresh start
        event(kind="start", restored=restored)
        train_async(args, create_rollout_manager=lambda a: fn, create_actor=Trainer, lease_interval=60)
        event(kind="done")
    """
)

# (fault point, passes to choose the kill from, when): the driver's own points are in CHILD.
LOCAL_POINTS = [
    ("async.train", 12, "before"),
    ("async.save_model", 6, "before"),
    ("async.save", 6, "before"),
    ("journal.fsync", 6, "during"),
    ("async.saved", 6, "during"),
    ("write.shard", 6, "during"),
    ("write.manifest", 6, "during"),
    ("commit.before-rename", 6, "during"),
    ("commit.after-rename", 6, "during"),
    ("async.marked", 6, "during"),
    ("async.committed", 6, "after"),
    ("retention.remove", 4, "after"),
    ("journal.compact", 4, "after"),
]
RESUME_POINTS = [("resume.scanned", 1), ("resume.place", 4)]
STORE_POINTS_LIST = [  # in this order, the even ones (generating ahead) first hit the lossy case
    ("async.committed", 5, "after"),
    ("journal.ship", 6, "during"),
    ("async.marked", 5, "during"),
    ("store.shard", 5, "during"),
    ("store.before-publish", 5, "during"),
    ("async.save", 5, "before"),
    ("async.saved", 5, "during"),
]
STORE_RESUME_POINTS = [("resume.download", 1), ("resume.place", 4)]


def schedule(
    seed: int,
    n: int,
    points: list[tuple[str, int, str]],
    resume_points: list[tuple[str, int]],
) -> list[dict[str, Any]]:
    """Every point once (at a seeded pass), a timer kill and a kill during a resume, then seeded
    ones up to ``n``; each trial generates ahead of training or behind it, alternately."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = [{"point": f"{name}@{rng.randint(1, k)}", "when": w} for name, k, w in points]
    out.append({"kill_after": rng.uniform(0.1, 0.4), "when": "timer"})
    name, k = rng.choice(resume_points)
    out.append(
        {"kill_after": rng.uniform(0.1, 0.3), "resume_point": f"{name}@{rng.randint(1, k)}", "when": "resume"}
    )
    while len(out) < n:
        r = rng.random()
        if r < 0.15:
            out.append({"kill_after": rng.uniform(0.05, 0.4), "when": "timer"})
        elif r < 0.9:
            name, k, w = rng.choice(points)
            out.append({"point": f"{name}@{rng.randint(1, k)}", "when": w})
        else:
            name, k = rng.choice(resume_points)
            out.append(
                {
                    "point": rng.choice(points)[0] + "@2",
                    "resume_point": f"{name}@{rng.randint(1, k)}",
                    "when": "resume",
                }
            )
    out = out[:n]
    for i, p in enumerate(out):
        p["mode"] = "ahead" if i % 2 == 0 else "behind"
    return out


def read_step(d: Path) -> int | None:
    f = d / "trainer_step"
    return int(f.read_text()) if f.exists() else None


def check_trial(d: Path, attempts: list[dict[str, Any]], label: str) -> None:
    """Exactly once in the surviving lineage, every trained image verified, the last run finished."""
    events = [json.loads(line) for line in (d / "events.log").read_text().splitlines() if line]
    trained = [e for e in events if e["kind"] == "trained"]
    final = attempts[-1]["attempt"]
    assert any(e["kind"] == "done" and e["attempt"] == final for e in events), (
        f"{label}: the last run did not finish"
    )
    assert not [e for e in trained if e["bad"]], f"{label}: a trained image did not verify"
    lineage: list[int] = []
    for a in attempts:
        keep_upto = a.get("restored_after")  # None: the final run, all of its steps count
        lineage += [
            i
            for e in trained
            if e["attempt"] == a["attempt"] and (keep_upto is None or e["step"] <= keep_upto)
            for i in e["indices"]
        ]
    everything = list(range(GROUPS * SIZE))
    missing = sorted(set(everything) - set(lineage))
    twice = sorted({i for i in lineage if lineage.count(i) > 1})
    assert not missing and not twice, f"{label}: not exactly once: missing {missing}, twice {twice}"
    assert sorted(lineage) == everything, f"{label}: {sorted(lineage)}"


def last_save_before_kill(d: Path, attempt: int) -> dict[str, Any] | None:
    saves = [
        e
        for e in (json.loads(line) for line in (d / "events.log").read_text().splitlines() if line)
        if e["kind"] == "save" and e["attempt"] == attempt
    ]
    return saves[-1] if saves else None


def run_suite(
    tmp_path: Path,
    server: ForkServer,
    points: list[dict[str, Any]],
    save_of: Any = None,
    modes: dict[str, dict[str, Any]] = MODES,
) -> dict[str, Any]:
    killed = 0
    unreached: list[str] = []
    at_save = {True: 0, False: 0}  # kills after a save(N): step N+1 drained by then, or in flight
    phases: dict[str, int] = {}
    try:
        for i, point in enumerate(points):
            d = tmp_path / f"trial{i}"
            d.mkdir()
            label = f"trial {i} {point} (ASYNC_CRASH_SEED={SEED})"
            base = {
                "dir": str(d),
                "interval": INTERVAL,
                "groups": GROUPS,
                "size": SIZE,
                "batch": BATCH,
                "steps": GROUPS // BATCH,
                "seed": SEED + i,
                **modes[point["mode"]],
            }
            if save_of is not None:
                base["save"] = save_of(i)
            attempts: list[dict[str, Any]] = []
            plan = [{k: v for k, v in point.items() if k in ("kill_after", "point")}]
            if "resume_point" in point:
                plan.append({"point": point["resume_point"]})
            plan.append({})
            for attempt, kill in enumerate(plan):
                res = server.run({**base, **kill, "attempt": attempt})
                entry: dict[str, Any] = {"attempt": attempt, "status": res["status"]}
                attempts.append(entry)
                if res["status"] == -signal.SIGKILL:
                    killed += 1
                    step = read_step(d)
                    entry["restored_after"] = step if step is not None else -1
                    if attempt == 0:
                        phases[point["when"]] = phases.get(point["when"], 0) + 1
                        last = last_save_before_kill(d, attempt)
                        if last is not None:
                            at_save[last["next_drained"]] += 1
                    continue
                if res["status"] != 0:
                    raise AssertionError(
                        f"{label}: attempt {attempt} exited {res['status']}: {server.close()[-3000:]}"
                    )
                if attempt == 0:
                    unreached.append(str(point))
                break  # the point was not reached: this run finished
            check_trial(d, attempts, label)
    finally:
        err = server.close()
    assert len(unreached) <= len(points) // 3, (
        f"{len(unreached)} of {len(points)} points never reached: {unreached}: {err[-2000:]}"
    )
    summary = {
        "points": len(points),
        "unreached": len(unreached),
        "sigkills": killed,
        "phases": phases,
        "at_save": at_save,
    }
    print(f"\n{summary}")
    return summary


def test_train_async_sigkill_around_save_trains_every_group_exactly_once(tmp_path):
    points = schedule(SEED, POINTS, LOCAL_POINTS, RESUME_POINTS)
    summary = run_suite(tmp_path, ForkServer(tmp_path, CHILD, trial_timeout=TRIAL_TIMEOUT_S), points)
    assert {"before", "during", "after"} <= set(summary["phases"]), summary
    # Killed after a save(N) with step N+1 drained already (the case that lost groups) and with
    # it still generating, each at least twice.
    assert summary["at_save"][True] >= 2 and summary["at_save"][False] >= 2, summary


def test_train_async_on_an_object_store_sigkill_around_save_trains_every_group_exactly_once(
    tmp_path, seaweed_s3
):
    """The same runs with ``--save``/``--load s3://...`` on SeaweedFS: the journal ships instead
    of fsyncing, the checkpoint uploads, and the resume downloads the shipments first."""
    bucket = seaweed_s3.bucket()
    points = schedule(SEED + 1, STORE_POINTS, STORE_POINTS_LIST, STORE_RESUME_POINTS)
    summary = run_suite(
        tmp_path,
        ForkServer(tmp_path, CHILD, seaweed_s3.env, trial_timeout=TRIAL_TIMEOUT_S),
        points,
        save_of=lambda i: f"s3://{bucket}/async{i}/ckpt",
        modes=STORE_MODES,
    )
    assert summary["sigkills"] >= STORE_POINTS // 2, summary
