"""Journal records made samples: media placed into the current run, bodies decoded when needed.

A recovery places a record's media (:class:`MediaPlacer`: into the current run's directory,
hard link else copy, each read as a bundle reads its media: a regular file, never through a
link) and builds its samples with the loader's sample class (:func:`build_sample`: a body the
class cannot build from is a :class:`~trainer_hooks.journal.JournalCorruptError` naming the
record). Completed groups stay encoded (:class:`LazyGroup`) until training takes them
(:func:`materialize`).
"""

from __future__ import annotations

import reprlib
from argparse import Namespace
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bundles import BundleVerificationError, MediaMissingError, MediaRef
from bundles.support import fault_point, open_regular_file, place_file
from trainer_hooks.journal import (
    JournalCorruptError,
    JournalError,
    JournalRecord,
    is_media_name,
    record_value,
    record_where,
)
from trainer_hooks.run_media import ensure_run_dir

__all__ = ["LazyGroup", "MediaPlacer", "build_sample", "decode_record", "materialize"]


class MediaPlacer:
    """Places journal media into the current run's directory (hard link, else copy) and, when
    asked, hashes them there; one per recovery."""

    def __init__(self, args: Namespace, source: Path, verify: bool) -> None:
        self.args = args
        self.source = source
        self.verify = verify
        self.placed: dict[str, MediaRef] = {}

    def refs(self, names: Iterable[str], where: str) -> dict[str, MediaRef]:
        out = {}
        for name in names:
            ref = self.placed.get(name)
            if ref is None:
                ref = self.placed[name] = self._place(name, where)
            out[name] = ref
        return out

    def _place(self, name: str, where: str) -> MediaRef:
        fault_point("resume.place", name)
        if not is_media_name(name):  # the scan refused such a record already; never a path
            raise JournalCorruptError(f"{where}: media name {name!r} is not '<64 hex><suffix>'")
        src = self.source / name
        run_dir = ensure_run_dir(self.args)
        dst = run_dir / name
        # Read as a bundle reads its media: a regular file, never through a symlink (a link out
        # of the journal would copy whatever it points at into the run), never blocking.
        try:
            f, size = open_regular_file(src)
        except FileNotFoundError:
            raise MediaMissingError(f"{src}: journal media file missing ({where})") from None
        except OSError as e:
            raise JournalError(
                f"{src}: cannot read the journal media file ({where}): {e.strerror or e}"
            ) from None
        with f:
            try:
                place_file(src, dst, opened=f)
            except OSError as e:
                raise JournalError(f"{src}: cannot place the journal media file in {run_dir}: {e}") from None
        ref = MediaRef("sha256:" + name[:64], size, name[64:], str(dst))
        if self.verify:
            found = MediaRef.from_file(dst)
            if found.digest != ref.digest:
                raise BundleVerificationError(
                    dst,
                    [
                        f"{dst}: digest: expected {ref.digest}, found {found.digest} (restored from {src}, {where})"
                    ],
                )
        return ref


class LazyGroup:
    """A finished group restored from the journal, decoded when training takes it."""

    __slots__ = ("_bodies", "_dicts", "_placer", "_sample_cls", "gid")

    def __init__(
        self, gid: int, bodies: list[tuple[JournalRecord, bool]], placer: MediaPlacer, sample_cls: Any
    ) -> None:
        self.gid = gid
        self._bodies = bodies  # (record, holds the whole group)
        self._placer = placer
        self._sample_cls = sample_cls
        self._dicts: list[tuple[Any, JournalRecord]] | None = None

    def __len__(self) -> int:
        return sum(int(r.b) if whole else 1 for r, whole in self._bodies)

    def undecoded(self) -> LazyGroup:
        """The same group, decoded anew when read: what a checkpoint keeps of a group handed to
        training (the trainer may change the samples decoded for it)."""
        return LazyGroup(self.gid, self._bodies, self._placer, self._sample_cls)

    def load_dicts(self) -> list[Any]:
        """The group's sample dicts (media placed in the current run's directory)."""
        return [d for d, _ in self._decoded()]

    def _decoded(self) -> list[tuple[Any, JournalRecord]]:
        """Each sample dict and the record it came from (what an error names)."""
        if self._dicts is None:
            out: list[tuple[Any, JournalRecord]] = []
            for rec, whole in self._bodies:
                value = decode_record(rec, self._placer)
                out.extend((v, rec) for v in (value["samples"] if whole else [value]))
            self._dicts = out
        return self._dicts

    def __iter__(self) -> Any:
        return iter(self.load())

    def __getitem__(self, i: Any) -> Any:
        return self.load()[i]

    def __repr__(self) -> str:
        return f"LazyGroup(gid={self.gid}, samples={len(self)})"

    def load(self) -> list[Any]:
        """The group's samples, built with the loader's sample class."""
        return [build_sample(s, self._sample_cls, rec) for s, rec in self._decoded()]


def decode_record(rec: JournalRecord, placer: MediaPlacer) -> Any:
    """Record ``rec``'s body, its media placed by ``placer``."""
    return record_value(rec, placer.refs(rec.media, record_where(rec)))


def build_sample(d: Any, cls: Any, rec: JournalRecord) -> Any:
    """A sample of record ``rec``'s body, built with ``cls``: a body the class cannot build from
    (wrong types, keys it refuses) is :class:`JournalCorruptError` naming the record, whatever
    the class raised."""
    if type(d) is list:  # a nested group's trajectory (Miles' list[list[Sample]])
        return [build_sample(x, cls, rec) for x in d]
    if not isinstance(d, dict):
        raise JournalCorruptError(
            f"{record_where(rec)}: body: expected a sample (a map) or a trajectory (a list), found "
            f"{type(d).__name__}; refusing to resume from this journal (nothing is guessed)"
        )
    if cls is dict:
        return d
    try:
        return cls.from_dict(d)
    except (JournalError, MemoryError):
        raise
    except Exception as e:  # the class's own refusal of untrusted values, whichever it is
        raise JournalCorruptError(
            f"{record_where(rec)}: body: not a {getattr(cls, '__name__', cls)}: {type(e).__name__}: "
            f"{reprlib.repr(str(e))}; refusing to resume from this journal (nothing is guessed)"
        ) from None


def materialize(group: Any) -> list[Any]:
    """A buffered group as samples (a :class:`LazyGroup` is decoded now)."""
    return group.load() if isinstance(group, LazyGroup) else group
