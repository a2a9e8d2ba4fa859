"""Generate the hostile corpus of the rollout journal's recovery: ``python tests/vectors/hostile/generate_journal.py``.

Each vector is a ``--save`` directory holding only a journal (``rollout/journal/``, no
checkpoint: a resume then replays the journal alone), whose bytes attack recovery (issue 24):

* ``r1-*``: a record whose ``media`` names ``../../evil.png`` (its checksum valid), with a file
  there, so that placing it would create ``evil.png`` outside the new run's media directory.
* ``r2-*``: journal media that the test replaces with a symlink to a private file outside the
  save directory (*made at test time*: a committed symlink would point outside the repository).
* ``r3-*``: a durable ``consumed`` record whose step has one bit flipped (1 -> 3): groups 4-7
  would come back and be trained twice.
* ``r4-*``: a bit flipped in the frame header (``meta_len``) of a durable record in the middle of
  the segment: read as a torn tail, the 8 groups after it would be generated and trained again.
* ``r5-segment-fifo``: a FIFO where a segment should be (*made at test time*: git cannot hold a
  FIFO); opening it with a blocking open hangs.
* ``r6-segment-directory``: a directory named like a segment (committed, with a README inside).

Vectors ending in ``-v1`` are written in journal format version 1 (the release before issue
24; still read), the others in version 2 (what the writer writes now); R5 and R6 do not depend
on the version (v1 journals beside them, so they reproduce on the previous release too).

``tests/vectors/hostile/journal/expected.json`` says, per vector, what recovery must raise
(``error``: the class name; ``message``: a substring; ``names``: the file, relative to the save
directory, the message must name), at which restored step, with media verification or not, and
which ``setup`` the test does first (``fifo``, ``symlink``: :func:`make_specials`).
``tests/test_journal_hostile.py`` reads the table. The vectors are inputs: a later change of the
writer's bytes does not require regenerating them (run this again when the table changes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "journal"
TABLE = HERE / "expected.json"
LINEAGE = "hostile"
JOURNAL = Path("rollout") / "journal"
SEGMENT = f"segment-000000000001-{LINEAGE}-000.rjl"
#: the name R5 and R6 put a FIFO or a directory at (sorted after SEGMENT)
SPECIAL = f"segment-000000000100-{LINEAGE}-000.rjl"
#: a tiny PNG (1x1), the media the R2 records reference
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
    "000003010100c9fe92ef0000000049454e44ae426082"
)
PNG_NAME = hashlib.sha256(PNG).hexdigest() + ".png"


def _body(value: Any) -> bytes:
    import zstandard

    from bundles import encode_sample

    return zstandard.ZstdCompressor(level=1).compress(encode_sample(value))


def _frame(version: int, meta: list[Any], body: bytes = b"") -> bytes:
    import msgpack

    m = msgpack.packb(meta)
    if version == 1:  # "RJR1" | meta_len | body_len | crc32(lengths + meta + body) | meta | body
        lengths = struct.pack("<II", len(m), len(body))
        crc = zlib.crc32(body, zlib.crc32(m, zlib.crc32(lengths)))
        return b"RJR1" + lengths + struct.pack("<I", crc) + m + body
    head = b"RJR2" + struct.pack("<III", len(m), len(body), zlib.crc32(body))
    return head + struct.pack("<I", zlib.crc32(m, zlib.crc32(head))) + m + body


def _segment_header(version: int, first_seq: int) -> bytes:
    import msgpack

    header = msgpack.packb(
        {"lineage": LINEAGE, "first_seq": first_seq, "created_at": 1.0, "fingerprint": None}
    )
    length = struct.pack("<I", len(header))
    if version == 1:
        return b"RBJOURNAL1\n" + length + header
    return b"RBJOURNAL2\n" + length + struct.pack("<I", zlib.crc32(header, zlib.crc32(length))) + header


def _records(version: int, media: str | None = None) -> tuple[bytes, dict[str, int]]:
    """Eight groups handed out (takes 1-8), finished (groups 9-16), a sync mark, consumed by
    step 0 (groups 0-3, record 17) and step 1 (groups 4-7, record 18), a sync mark. With
    ``media``: only the takes and a sync mark (every group in flight, so a resume decodes their
    prompts and places their media at once), group 0's referencing that name. Returns the
    segment and the offsets of the records."""
    out = bytearray(_segment_header(version, 1))
    at: dict[str, int] = {}
    seq = 0
    for g in range(8):
        seq += 1
        names = [media] if media is not None and g == 0 else []
        b = {"cursor": {"offset": g + 1}, "n": 1, "end": g}
        at[f"take{g}"] = len(out)
        out += _frame(
            version, [seq, "take", 1.0, g, b, names], _body({"samples": [{"index": g, "prompt": f"p{g}"}]})
        )
    if media is not None:
        out += _frame(version, [-1, "sync", 3.0, -1, seq, []])
        return bytes(out), at
    for g in range(8):
        seq += 1
        at[f"group{g}"] = len(out)
        sample = {"index": g, "prompt": f"p{g}", "tokens": [1, 2, 3], "reward": 1.0}
        out += _frame(version, [seq, "group", 2.0, g, 1, []], _body({"samples": [sample]}))
    at["sync1"] = len(out)
    out += _frame(version, [-1, "sync", 3.0, -1, seq, []])
    for step, gids in ((0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])):
        seq += 1
        at[f"consumed{step}"] = len(out)
        out += _frame(version, [seq, "consumed", 4.0, step, gids, []])
    at["sync2"] = len(out)
    out += _frame(version, [-1, "sync", 5.0, -1, seq, []])
    return bytes(out), at


def _write(dest: Path, segment: bytes, media: dict[str, bytes] | None = None) -> None:
    jdir = dest / JOURNAL
    (jdir / "media").mkdir(parents=True)
    (jdir / SEGMENT).write_bytes(segment)
    for name, data in (media or {}).items():
        (jdir / "media" / name).write_bytes(data)


def _flip(data: bytes, offset: int, bit: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


def build(name: str, dest: Path) -> None:
    """Write vector ``name`` into ``dest`` (a new directory)."""
    version = 1 if name.endswith("-v1") or name.startswith(("r5-", "r6-")) else 2
    frame = 16 if version == 1 else 20
    if name.startswith("r1-"):
        segment, _ = _records(version, media="../../evil.png")
        _write(dest, segment)
        # jdir/media/../../evil.png: a file there, so the record is not merely "missing".
        (dest / "rollout" / "evil.png").write_bytes(b"not the run's media")
    elif name.startswith("r2-"):
        segment, _ = _records(version, media=PNG_NAME)
        _write(dest, segment, {PNG_NAME: PNG})
    elif name.startswith("r3-"):
        segment, at = _records(version)
        # meta = [seq, "consumed", at, step, ...]: the step is the byte after the float64.
        meta = at["consumed1"] + frame
        import msgpack

        step_at = meta + len(msgpack.packb([18, "consumed", 4.0]))
        assert segment[step_at] == 1, segment[step_at]
        _write(dest, _flip(segment, step_at, 1))  # 1 -> 3
    elif name.startswith("r4-"):
        segment, at = _records(version)
        _write(dest, _flip(segment, at["group0"] + 4, 3))  # meta_len of record 9 (+8)
    elif name.startswith(("r5-", "r6-")):
        segment, _ = _records(version)
        _write(dest, segment)
        if name.startswith("r6-"):
            special = dest / JOURNAL / SPECIAL
            special.mkdir()
            (special / "README").write_text(
                "A directory named like a journal segment (tests/vectors/hostile/generate_journal.py, R6).\n"
            )
    else:
        raise KeyError(name)


def _row(attack: str, error: str, message: str, names: str, **over: Any) -> dict[str, Any]:
    return {
        "attack": attack,
        "error": error,
        "message": message,
        "names": str(JOURNAL / names),
        "restored_step": 1,
        "verify_media": True,
        "setup": None,
        **over,
    }


def vectors() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for suffix, version in (("", 2), ("-v1", 1)):
        _, at = _records(version)
        traversal = "take record: media[0]: expected a content-addressed name '<64 hex><suffix>', found '../../evil.png'"
        out[f"r1-media-traversal{suffix}"] = _row(
            "R1",
            "JournalCorruptError",
            f"record at byte {at['take0']} (seq 1 expected): {traversal}",
            SEGMENT,
        )
        out[f"r2-media-symlink{suffix}"] = _row(
            "R2", "UnsafeBundleError", "expected a regular file, found a symlink", f"media/{PNG_NAME}",
            verify_media=False, setup="symlink",
        )  # fmt: skip
        crc = "frame checksum" if version == 2 else "checksum"
        out[f"r3-consumed-step-flip{suffix}"] = _row(
            "R3", "JournalCorruptError",
            f"record at byte {at['consumed1']} (seq 18 expected) is damaged: {crc}: expected", SEGMENT,
        )  # fmt: skip
        damage = "frame checksum: expected" if version == 2 else "checksum: expected"
        out[f"r4-frame-header-flip{suffix}"] = _row(
            "R4", "JournalCorruptError",
            f"record at byte {at['group0']} (seq 9 expected) is damaged: {damage}", SEGMENT,
        )  # fmt: skip
    out["r5-segment-fifo"] = _row(
        "R5", "UnsafeBundleError", "expected a regular file, found a FIFO", SPECIAL, setup="fifo"
    )
    out["r6-segment-directory"] = _row(
        "R6", "UnsafeBundleError", "expected a regular file, found a directory", SPECIAL
    )
    return out


def make_specials(dest: Path, name: str, outside: Path) -> None:
    """What git cannot hold, made in the copy ``dest`` of vector ``name`` at test time: R5's FIFO,
    R2's symlink from the journal media to ``outside`` (a private file outside the save)."""
    setup = vectors()[name]["setup"]
    if setup == "fifo":
        os.mkfifo(dest / JOURNAL / SPECIAL)
    elif setup == "symlink":
        media = dest / JOURNAL / "media" / PNG_NAME
        media.unlink()
        media.symlink_to(outside)


def main() -> None:
    if HERE.exists():
        shutil.rmtree(HERE)
    HERE.mkdir(parents=True)
    table = vectors()
    for name in sorted(table):
        build(name, HERE / name)
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} vectors under {HERE}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    main()
