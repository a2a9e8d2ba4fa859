"""Crash injection: a checkpoint save killed with SIGKILL at named points of the write, the
commit and retention, chosen by a seeded schedule (issue 8, fault suite).

A server process imports trainer_hooks once, then forks one child per kill point; the child arms
the point (``bundles._local.faults.arm_kill``, the same switch as ``ROLLOUT_BUNDLES_KILL_AT``) and runs
a real ``save_rollout_checkpoint`` with ``--keep-rollout-checkpoints 2``, which kills itself when
it passes the point. After each kill this process checks that

* every checkpoint a reader lists opens and fully verifies, the previous one included, with the
  samples it was written with;
* the checkpoint being written is either absent or complete (the new samples, fully verified);
* no staging or retired directory is ever taken for a bundle (``is_bundle`` and ``open_bundle``
  refuse every hidden leftover);

and then that the next save (here, in this process) leaves no leftover behind and K checkpoints.

The schedule: one random pass count for each kind of point, then random others up to
``CRASH_POINTS`` (default 24), from a seed (``CRASH_SEED``, default fixed) printed on failure.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import trainer_args

import trainer_hooks
from bundles import BundleNotFoundError, is_bundle, open_bundle
from bundles._local.fs import remove_tree
from bundles.support import scratch_dir
from trainer_hooks import (
    Sample,
    list_rollout_checkpoints,
    save_rollout_checkpoint,
    store_media,
)

IMPORT_ROOT = Path(trainer_hooks.__file__).resolve().parents[1]
SEED = int(os.environ.get("CRASH_SEED", "20261130"))
POINTS = int(os.environ.get("CRASH_POINTS", "24"))
MEDIA_FILES = 12
KEEP = 2
TRIAL_TIMEOUT_S = 60

SERVER = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {repo!r})
    import bundles._local.commit
    from bundles._local import faults as _faults
    from trainer_hooks import Sample, parse_args, save_rollout_checkpoint

    cfg = json.loads(sys.argv[1])
    args = parse_args(cfg["argv"])
    print("ready", flush=True)
    for line in sys.stdin:
        trial = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if trial["no_exchange"]:  # a kernel or filesystem without RENAME_EXCHANGE
                    bundles._local.commit.exchange = lambda a, b: False
                _faults.arm_kill(trial["point"])
                group = [Sample(index=i, prompt=trial["version"], status=Sample.Status.COMPLETED,
                                multimodal_inputs={{"images": [p]}}) for i, p in enumerate(cfg["images"])]
                save_rollout_checkpoint(args, trial["id"], [], [group])
                code = 0
            except BaseException as e:
                print(f"save failed: {{type(e).__name__}}: {{e}}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({{"status": os.waitstatus_to_exitcode(status)}}), flush=True)
    """
)

# Kinds of kill points: (name, how many times a save passes it, which save) - "new" writes the
# next rollout id (and retention removes the oldest), "overwrite" rewrites the newest id.
# MEDIA_FILES media + 1 shard + 1 manifest are fsynced one by one (fewer than syncfs's 32).
KINDS: list[tuple[str, int, str, bool]] = [
    ("write.media", MEDIA_FILES, "new", False),
    ("write.shard", 1, "new", False),
    ("write.manifest", 1, "new", False),
    ("write.durability", 1, "new", False),
    ("durability.fsync", MEDIA_FILES + 2, "new", False),
    ("commit.before-rename", 1, "new", False),
    ("commit.before-noreplace", 1, "new", False),
    ("commit.after-rename", 1, "new", False),
    ("retention.remove", 1, "new", False),
    ("remove_bundle.before-retire", 1, "new", False),
    ("remove_bundle.after-retire", 1, "new", False),
    ("discard.after-manifest", 1, "new", False),
    ("remove_tree.entry", MEDIA_FILES + 3, "new", False),  # the removed checkpoint's entries
    ("commit.before-rename", 1, "overwrite", False),
    ("commit.after-rename", 1, "overwrite", False),
    ("remove_tree.entry", MEDIA_FILES + 3, "overwrite", False),  # the swapped-out old bundle
    ("commit.between-renames", 1, "overwrite", True),
    ("commit.after-rename", 1, "overwrite", True),
    ("remove_tree.entry", MEDIA_FILES + 3, "overwrite", True),
]


def schedule(seed: int, n: int) -> list[dict[str, Any]]:
    """One random pass of every kind, then distinct others at random: ``n`` kill points."""
    rng = random.Random(seed)
    every = [(name, k, mode, noex) for name, count, mode, noex in KINDS for k in range(1, count + 1)]
    chosen = []
    for name, count, mode, noex in KINDS:
        chosen.append((name, rng.randint(1, count), mode, noex))
    rest = [c for c in every if c not in chosen]
    chosen += rng.sample(rest, max(0, n - len(chosen)))
    rng.shuffle(chosen)
    return [{"point": f"{name}@{k}", "mode": mode, "no_exchange": noex} for name, k, mode, noex in chosen]


class Server:
    def __init__(self, tmp_path: Path, argv: list[str], images: list[str]) -> None:
        script = tmp_path / "server.py"
        script.write_text(SERVER.format(repo=str(IMPORT_ROOT)))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps({"argv": argv, "images": images})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its forked children too can be killed as one group
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", self.proc.stderr.read() if self.proc.stderr else line

    def run(self, trial: dict[str, Any]) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(trial) + "\n")
        self.proc.stdin.flush()
        # One line per trial; a child that hangs instead of dying fails the test, never stalls it.
        ready, _, _ = select.select([self.proc.stdout], [], [], TRIAL_TIMEOUT_S)
        if not ready:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(
                f"{trial['point']}: the save neither died nor finished in {TRIAL_TIMEOUT_S}s"
            )
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "server died"
        return int(json.loads(line)["status"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the server's loop ends
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _versions(path: Path) -> set[str]:
    """Fully verify the bundle at ``path``; the set of prompts its samples hold."""
    bundle = open_bundle(path, verify="full")
    samples = list(bundle.samples())
    assert len(samples) == MEDIA_FILES
    return {s["prompt"] for s in samples}


def _check_after_kill(root: Path, expect: dict[int, str], trial: dict[str, Any]) -> None:
    """What a reader may see after the kill (see the module docstring)."""
    where = f"after a kill at {trial['point']} ({trial['mode']}, exchange {not trial['no_exchange']})"
    rollout = root / "rollout"
    listed = list_rollout_checkpoints(root)
    for rid, path in listed.items():
        assert path.name == f"fully_async_{rid}" and is_bundle(path), where
        version = _versions(path)
        # Each listed checkpoint holds what was committed under its id, or the new samples.
        assert version <= {expect.get(rid), trial["version"]} and len(version) == 1, (where, rid, version)
    previous = trial["previous"]
    if previous not in listed:
        # Only where RENAME_EXCHANGE is missing, between the two renames of an overwrite: the
        # next write into the directory must put the complete new bundle in place.
        assert trial["mode"] == "overwrite" and trial["no_exchange"], (
            f"{where}: checkpoint {previous} is gone"
        )
        remove_tree(scratch_dir(rollout / "probe"))  # any write into the directory recovers it
        listed = list_rollout_checkpoints(root)
        assert previous in listed, f"{where}: checkpoint {previous} was not recovered"
        assert _versions(listed[previous]) == {trial["version"]}, where
        trial["recovered"] = True
    if trial["mode"] == "new":
        assert _versions(listed[previous]) == {expect[previous]}, where
    if trial["id"] in listed and trial["mode"] == "new":
        assert _versions(listed[trial["id"]]) == {trial["version"]}, where
    for p in rollout.iterdir():
        if p.name.startswith("."):
            assert not is_bundle(p), f"{where}: {p.name} passes for a bundle"
            with pytest.raises(BundleNotFoundError):
                open_bundle(p)


def test_sigkill_at_scheduled_points_of_a_checkpoint_save(tmp_path: Path) -> None:
    started = time.monotonic()
    args = trainer_args(tmp_path, "victim", "--keep-rollout-checkpoints", str(KEEP))
    images = [store_media(args, os.urandom(2048) + bytes([i]), ".png").path for i in range(MEDIA_FILES)]
    root = Path(args.save)

    def save(rid: int, version: str) -> None:
        group = [
            Sample(index=i, prompt=version, status=Sample.Status.COMPLETED, multimodal_inputs={"images": [p]})
            for i, p in enumerate(images)
        ]
        save_rollout_checkpoint(args, rid, [], [group])

    expect: dict[int, str] = {}
    for rid in range(KEEP):
        save(rid, f"v{rid}")
        expect[rid] = f"v{rid}"
    argv = [
        "--rollout-batch-size", "1", "--shared-media-dir", args.shared_media_dir, "--run-uuid", "victim",
        "--save", str(root), "--keep-rollout-checkpoints", str(KEEP),
    ]  # fmt: skip
    plan = schedule(SEED, POINTS)
    assert len({(t["point"], t["mode"], t["no_exchange"]) for t in plan}) == len(plan) >= 20
    server = Server(tmp_path, argv, images)
    killed = recovered = 0
    try:
        for n, trial in enumerate(plan):
            newest = max(expect)
            trial["id"] = newest + 1 if trial["mode"] == "new" else newest
            trial["previous"] = newest
            trial["version"] = f"crash{n}"
            status = server.run(trial)
            assert status == -signal.SIGKILL, f"seed {SEED}: {trial['point']} was never reached ({status})"
            killed += 1
            _check_after_kill(root, expect, trial)
            recovered += bool(trial.get("recovered"))
            # The next save cleans up after the dead writer and applies retention.
            rid = trial["id"]
            save(rid, f"v{rid}.{n}")
            expect[rid] = f"v{rid}.{n}"
            leftovers = sorted(p.name for p in (root / "rollout").iterdir() if p.name.startswith("."))
            assert leftovers == [], f"seed {SEED}, {trial['point']}: left behind {leftovers}"
            assert sorted(list_rollout_checkpoints(root)) == sorted(expect)[-KEEP:]
            expect = {k: v for k, v in expect.items() if k in list_rollout_checkpoints(root)}
    finally:
        server.close()
    elapsed = time.monotonic() - started
    print(
        f"crash injection: {killed} SIGKILLs at {len(plan)} distinct points, seed {SEED}, "
        f"{recovered} interrupted overwrites recovered, {elapsed:.1f}s"
    )
    assert killed == len(plan)
