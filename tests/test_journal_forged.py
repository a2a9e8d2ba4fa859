"""Forged journal records of the right outer shape (issue 36, item 5): a valid frame and valid
checksums around a meta ``[seq, kind, at, a, b, media]`` whose inner types and values are wrong,
or a body that is not what its kind holds. Whatever a resume does with one (scan, replay,
decode, build the samples with the trainer's class), it ends in a ``JournalCorruptError`` naming
the segment and the record's byte offset, or resumes (a forged value within every bound is a
value the writer could have written): never a TypeError, AttributeError, ValueError, KeyError or
MemoryError from inside the replay. On e5d94e3 5 of the issue's 21 such records escaped.

An exhaustive structured pass (every kind, every field, a list of wrong values; every kind with a
body, a list of wrong bodies, with plain dicts and with :class:`trainer_hooks.Sample`) and a
hypothesis pass over arbitrary msgpack values."""

from __future__ import annotations

import importlib.util
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
import zstandard
from helpers import trainer_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import encode_sample
from trainer_hooks import Sample
from trainer_hooks.journal import KINDS, JournalCorruptError, journal_dir
from trainer_hooks.rollout import RolloutLedger, materialize

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "journal_generator", ROOT / "tests" / "vectors" / "hostile" / "generate_journal.py"
)
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(generator)  # type: ignore[union-attr]

COMPLETED = Sample.Status.COMPLETED.value
GOOD_SAMPLE = {"index": 0, "status": COMPLETED, "tokens": [1, 2]}
#: A well-formed record of each kind after group 0's take: (seq, a, b, body value or None).
WELL_FORMED: dict[str, tuple[int, Any, Any, Any]] = {
    "take": (2, 1, {"cursor": {"offset": 2}, "n": 1, "end": 1}, {"samples": [GOOD_SAMPLE]}),
    "sample": (2, 0, 0, GOOD_SAMPLE),
    "group": (2, 0, 1, {"samples": [GOOD_SAMPLE]}),
    "consumed": (2, 0, [0], None),
    "recycled": (2, 0, {"n": 1}, {"samples": [GOOD_SAMPLE]}),
    "dropped": (2, 0, None, None),
    "sync": (-1, -1, 1, None),
}
#: Wrong inner values, each put in every field of every kind.
WRONG: list[Any] = [
    None, True, -1, 2**64 - 1, -(2**63), 1.5, float("nan"), "x", b"x", [], [None], [[1]], [2**64 - 1],
    {}, {"x": 1}, {1: 2}, {"cursor": None, "n": "x"}, {"n": -1}, {"end": 2**63}, {"n": 2**40},
    ["ab" * 32 + ".png"], [7],
]  # fmt: skip


def _zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(raw)


def _declaring(size: int) -> bytes:
    """A zstd frame whose header declares ``size`` bytes decompressed (its blocks hold 100)."""
    frame = _zstd(b"a" * 100)
    assert frame[4] == 0x20  # single segment, a 1-byte content size: replaced by an 8-byte one
    return frame[:4] + bytes([0xE0]) + struct.pack("<Q", size) + frame[6:]


#: Wrong bodies (compressed bytes), each given to every kind that has a body.
BODIES: dict[str, bytes] = {
    "an int": _zstd(encode_sample(42)),
    "samples of ints": _zstd(encode_sample({"samples": [1, "x"]})),
    "samples not a list": _zstd(encode_sample({"samples": 3})),
    "a trajectory of ints": _zstd(encode_sample({"samples": [[1, 2]]})),
    "a status no Sample has": _zstd(encode_sample({"samples": [{"status": "nonsense"}]})),
    "no status": _zstd(encode_sample({"samples": [{"index": 0}]})),
    "a Sample field of another type": _zstd(
        encode_sample({"samples": [{"status": COMPLETED, "spec_info": 5, "__dict__": 5}]})
    ),
    "not zstd": b"garbage, not a zstd frame",
    "zstd of no codec value": _zstd(b"\xc1\xc1\xc1"),
    "zstd declaring 2**40 bytes": _declaring(2**40),
    "zstd declaring 2**62 bytes": _declaring(2**62),
    "empty zstd": _zstd(b""),
}


def _journal(root: Path, meta: list[Any], body: bytes) -> tuple[Path, int]:
    """``root/ckpt``'s journal: group 0's take (seq 1), then the forged record; its segment and
    the forged record's byte offset."""
    out = bytearray(generator._segment_header(2, 1))
    take = [1, "take", 1.0, 0, {"cursor": {"offset": 1}, "n": 1, "end": 0}, []]
    out += generator._frame(2, take, _zstd(encode_sample({"samples": [GOOD_SAMPLE]})))
    offset = len(out)
    out += generator._frame(2, meta, body)
    jdir = journal_dir(root / "ckpt")
    jdir.mkdir(parents=True)
    segment = jdir / generator.SEGMENT
    segment.write_bytes(bytes(out))
    return segment, offset


def _resume(root: Path, cls: Any) -> str | None:
    """Resume from ``root/ckpt`` as a trainer does, every group built: None, or the message of
    the JournalCorruptError it raised (any other exception escapes the test)."""
    try:
        state = RolloutLedger(trainer_args(root, "run-b", "--rollout-journal-interval", "0.05")).recover(
            None, sample_cls=cls
        )
        for _, group in state.completed:
            materialize(group)
    except JournalCorruptError as e:
        return str(e)
    return None


def _check(root: Path, meta: list[Any], body: bytes, cls: Any) -> str | None:
    segment, offset = _journal(root, meta, body)
    message = _resume(root, cls)
    if message is not None:
        assert message.startswith(f"{segment}: record at byte {offset} ("), message
    return message


def _body_of(kind: str) -> bytes:
    value = WELL_FORMED[kind][3]
    return b"" if value is None else _zstd(encode_sample(value))


def _meta_cases() -> list[Any]:
    out = []
    for kind in sorted(KINDS):
        for i, field in enumerate(("at", "a", "b", "media")):
            for j, value in enumerate(WRONG):
                out.append(pytest.param(kind, i, value, id=f"{kind}-{field}-{j}"))
    return out


@pytest.mark.parametrize(("kind", "field", "value"), _meta_cases())
def test_a_forged_meta_of_the_right_shape_is_refused_naming_segment_and_byte(tmp_path, kind, field, value):
    seq, a, b, _ = WELL_FORMED[kind]
    meta = [seq, kind, 2.0, a, b, []]
    meta[2 + field] = value
    message = _check(tmp_path, meta, _body_of(kind), Sample)
    if message is None:  # resumed: then the forged value is one the table accepts
        assert KINDS[kind].problem(*meta[:1], *meta[2:]) is None, meta
    else:
        assert f"{kind} record" in message or "body" in message, message


@pytest.mark.parametrize("cls", [dict, Sample], ids=["dict", "Sample"])
@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("kind", sorted(k for k, v in KINDS.items() if v.body is not None))
def test_a_forged_body_is_refused_naming_segment_and_byte(tmp_path, kind, body, cls):
    seq, a, b, _ = WELL_FORMED[kind]
    message = _check(tmp_path, [seq, kind, 2.0, a, b, []], BODIES[body], cls)
    if cls is dict and (body in DICT_SAMPLES or (kind == "sample" and body in A_MAP)):
        assert message is None, message  # a plain dict sample: any map is one
    else:
        assert message is not None and f"{seq}, {kind}): body: " in message, message


#: Bodies whose samples are maps a plain-dict resume takes as they are (only Sample refuses them).
DICT_SAMPLES = {"no status", "a status no Sample has", "a Sample field of another type"}
#: Bodies that are one map: a ``sample`` record's body, whatever its keys.
A_MAP = {"samples of ints", "samples not a list", "a trajectory of ints"}


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(["ab" * 32 + ".png", "../x.png"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["cursor", "n", "end", "samples", "x"]) | st.integers(0, 3), inner, max_size=4
        )
    ),
    max_leaves=8,
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(sorted(KINDS)),
    fields=st.fixed_dictionaries({}, optional={k: _VALUES for k in ("at", "a", "b", "media")}),
    body=st.none() | st.sampled_from(sorted(BODIES)) | st.binary(max_size=32),
    cls=st.sampled_from([dict, Sample]),
)
def test_no_forged_record_escapes_as_another_exception(tmp_path, kind, fields, body, cls):
    seq, a, b, _ = WELL_FORMED[kind]
    meta = [seq, kind, fields.get("at", 2.0), fields.get("a", a), fields.get("b", b), fields.get("media", [])]
    raw = _body_of(kind) if body is None else BODIES.get(body, body) if isinstance(body, str) else body
    _check(tmp_path / uuid.uuid4().hex, meta, raw, cls)
