"""Loaders give back the caller's sample class: explicit ``sample_cls=``, else Miles' own
``miles.utils.types.Sample`` when ``miles`` imports, else ``trainer_hooks.Sample``; dicts on request.

Miles is not installable here, so the "Miles installed" case runs in a subprocess against a small
``miles`` package written to a temporary directory and put on ``sys.path``: a real import path
with its own ``Sample`` and its own ``Status`` enum, as Miles' is (``miles/utils/types.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import trainer_args

from bundles import BundleFormatError, open_bundle, write_bundle
from trainer_hooks import (
    FullyAsyncRolloutFn,
    Sample,
    default_sample_cls,
    load_debug_rollout_data,
    load_rollout_checkpoint,
    save_debug_rollout_data,
    save_rollout_checkpoint,
    store_media,
)
from trainer_hooks.testing import png_bytes

REPO = Path(__file__).resolve().parents[1]

# A Miles-shaped Sample with its own Status enum: equal values, a different class.
MILES_TYPES = """
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class AdapterRef:
    name: str
    slot: int


@dataclass(frozen=True)
class RewardSpec:
    rm_type: str | None = None
    custom_rm_path: str | None = None


@dataclass
class Sample:
    index: int | None = None
    prompt: Any = ""
    tokens: list = field(default_factory=list)
    multimodal_inputs: Any = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    adapter: AdapterRef | None = None
    reward_spec: RewardSpec | None = None

    def to_dict(self):
        d = self.__dict__.copy()
        d["status"] = self.status.value
        return d

    @staticmethod
    def from_dict(data):
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        names = set(Sample.__dataclass_fields__)
        s = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(s, k, v)
        return s

    def reset_for_retry(self):
        self.tokens = []
        self.status = Sample.Status.ABORTED
"""

SCRIPT = """
import asyncio, sys
from pathlib import Path
import bundles
import trainer_hooks as th
from trainer_hooks.testing import png_bytes
from miles.utils.types import AdapterRef, RewardSpec, Sample

tmp = Path(sys.argv[1])
assert th.default_sample_cls() is Sample

args = th.parse_args([
    "--rollout-batch-size",
    "1",
    "--shared-media-dir", str(tmp / "shared"), "--run-uuid", "run-a",
    "--save", str(tmp / "ckpt"), "--load", str(tmp / "ckpt"),
    "--save-debug-rollout-data", str(tmp / "dumps" / "r_{rollout_id}"),
    "--load-debug-rollout-data", str(tmp / "dumps" / "r_{rollout_id}"),
])
ref = th.store_media(args, png_bytes(2, 2, (1, 2, 3)))
def make(i, status):
    return Sample(index=i, prompt=f"p{i}", tokens=[i, 7], multimodal_inputs={"images": [ref]}, status=status,
                  adapter=AdapterRef("lora", i), reward_spec=RewardSpec("math"))

def check(samples, where):
    assert [type(s) for s in samples] == [Sample] * len(samples), (where, [type(s) for s in samples])
    # Miles' own comparison against its own enum: True for every truncated sample.
    truncated = [s.status == Sample.Status.TRUNCATED for s in samples]
    assert truncated == [s.index % 2 == 1 for s in samples], (where, truncated)
    # Miles' own record classes come back (to_dict leaves them objects; they are stored as records).
    assert [(type(s.adapter), s.adapter) for s in samples] == [(AdapterRef, AdapterRef("lora", s.index)) for s in samples]
    assert all(type(s.reward_spec) is RewardSpec for s in samples)

# Debug dump
th.save_debug_rollout_data(args, [make(i, Sample.Status.TRUNCATED if i % 2 else Sample.Status.COMPLETED) for i in range(4)], 3, False)
loaded, _ = th.load_debug_rollout_data(args, 3)
check(loaded, "load_debug_rollout_data")

# Checkpoint: load_rollout_checkpoint and FullyAsyncRolloutFn.load
completed = [[make(1, Sample.Status.TRUNCATED), make(2, Sample.Status.COMPLETED)]]
pending = [[make(5, Sample.Status.PENDING)]]
th.save_rollout_checkpoint(args, 2, pending, completed)
got_pending, got_completed = th.load_rollout_checkpoint(args, 2)
check(got_completed[0], "load_rollout_checkpoint")
assert type(got_pending[0][0]) is Sample and got_pending[0][0].status == Sample.Status.ABORTED  # its reset_for_retry

async def gen(args, group):
    return group
fn = th.FullyAsyncRolloutFn(args, lambda n: [], gen)
fn.load(2)
check([s for g in fn.buffer.groups() for s in g], "FullyAsyncRolloutFn.load")
fn.close()

# A bundle, generically
bundle = bundles.open_bundle(th.checkpoint_path(args.save, 2))
check(list(bundle.samples(sample_cls=th.default_sample_cls()))[1:], "Bundle.samples")
print("ok")
"""


@pytest.fixture
def miles_path(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    pkg = root / "miles" / "utils"
    pkg.mkdir(parents=True)
    (root / "miles" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "types.py").write_text(textwrap.dedent(MILES_TYPES))
    return root


def test_with_miles_importable_every_loader_returns_miles_sample(tmp_path, miles_path):
    env = {"PYTHONPATH": f"{miles_path}:{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_miles_present_but_broken_falls_back_with_a_warning(tmp_path, miles_path):
    (miles_path / "miles" / "utils" / "types.py").write_text("import a_dependency_that_is_missing\n")
    script = (
        "import logging, trainer_hooks as th; logging.basicConfig();"
        "print(th.default_sample_cls() is th.Sample)"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{miles_path}:{REPO}", "PATH": "/usr/bin:/bin"},
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    assert "miles is installed but miles.utils.types does not import" in r.stderr
    assert "a_dependency_that_is_missing" in r.stderr


def test_records_written_with_miles_read_without_it_are_trainer_hooks_classes(tmp_path, miles_path):
    """A dump written in a Miles process (Miles' AdapterRef) read where Miles is absent."""
    from trainer_hooks import AdapterRef, RewardSpec, parse_args

    env = {"PYTHONPATH": f"{miles_path}:{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--load-debug-rollout-data",
            str(tmp_path / "work" / "dumps" / "r_{rollout_id}"),
        ]
    )
    loaded, _ = load_debug_rollout_data(args, 3)
    assert [type(s.adapter) for s in loaded] == [AdapterRef] * 4
    assert loaded[1].adapter == AdapterRef("lora", 1) and loaded[0].reward_spec == RewardSpec("math")


def test_without_miles_the_default_is_trainer_hooks_sample():
    with pytest.raises(ImportError):
        __import__("miles.utils.types")
    assert default_sample_cls() is Sample


class MySample(Sample):
    """A caller's own subclass: from_dict must build it, not the base class."""


def _args(tmp_path):
    return trainer_args(tmp_path, "run-a", dumps="r_{rollout_id}")


def test_explicit_sample_cls_and_dicts(tmp_path):
    args = _args(tmp_path)
    ref = store_media(args, png_bytes(2, 2, (9, 9, 9)))
    rows = [
        Sample(index=i, multimodal_inputs={"images": [ref]}, status=Sample.Status.TRUNCATED) for i in range(3)
    ]
    save_debug_rollout_data(args, rows, 0, False)
    mine, _ = load_debug_rollout_data(args, 0, sample_cls=MySample)
    assert [type(s) for s in mine] == [MySample] * 3
    assert all(s.status is Sample.Status.TRUNCATED for s in mine)
    dicts, _ = load_debug_rollout_data(args, 0, sample_cls=dict)
    assert [type(d) for d in dicts] == [dict] * 3 and dicts[0]["status"] == "truncated"
    plain, _ = load_debug_rollout_data(args, 0)
    assert [type(s) for s in plain] == [Sample] * 3

    save_rollout_checkpoint(args, 1, [rows[:1]], [rows[1:]])
    pending, completed = load_rollout_checkpoint(args, 1, sample_cls=MySample)
    assert type(pending[0][0]) is MySample and pending[0][0].status is Sample.Status.ABORTED
    assert [type(s) for s in completed[0]] == [MySample] * 2
    pending, completed = load_rollout_checkpoint(args, 1, sample_cls=dict)
    assert pending[0][0]["status"] == "truncated" and completed[0][0]["index"] == 1  # stored as submitted

    async def gen(args, group):
        return group

    with FullyAsyncRolloutFn(args, lambda n: [], gen, sample_cls=MySample) as fn:
        fn.load(1)
        assert [type(s) for g in fn.buffer.groups() for s in g] == [MySample] * 2
    with FullyAsyncRolloutFn(args, lambda n: [], gen) as fn:
        fn.load(1, sample_cls=dict)
        assert [type(s) for g in fn.buffer.groups() for s in g] == [dict] * 2

    with pytest.raises(TypeError, match="sample_cls: expected dict or a class with from_dict"):
        load_debug_rollout_data(args, 0, sample_cls=int)


def test_bundle_samples_with_sample_cls_names_the_bad_row(tmp_path):
    write_bundle(tmp_path / "b", [{"status": "completed", "index": 0}, {"index": 1}])
    bundle = open_bundle(tmp_path / "b")
    assert [type(d) for d in bundle.samples()] == [dict, dict]
    it = bundle.samples(sample_cls=Sample)
    assert next(it).index == 0
    with pytest.raises(
        BundleFormatError, match=r"b: samples\[1\]: Sample.from_dict: KeyError: .*'status' is required"
    ):
        next(it)
    with pytest.raises(TypeError, match="sample_cls: expected a class with from_dict"):
        bundle.samples(sample_cls=object)
