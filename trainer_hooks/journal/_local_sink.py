"""The rollout journal in a local directory (:class:`LocalFiles`): segments fsynced in place.

The disk's :class:`~._sink.JournalSink`: the writer's segment files are the journal itself, made
durable by fsyncing the media placed since the last flush, the directories, then the segment, and
ended with a sync mark (the segment goes on); compaction unlinks covered segments and the media
only they referenced, under the writer's locks. A directory's listing never lags its writes, so
reading it back is reading it in place.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bundles.support import fault_point
from trainer_hooks.journal._format import MEDIA_DIR, SEGMENT_PREFIX, SEGMENT_SUFFIX
from trainer_hooks.journal._index import SegmentIndex
from trainer_hooks.journal._scan import scan_journal
from trainer_hooks.journal._sink import Adopted, Batch, Freed, JournalSink, sync_mark

__all__ = ["LocalFiles", "fsync_path"]


def fsync_path(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalFiles(JournalSink):
    """The journal in a local directory: segments fsynced in place, media in ``media/``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._directory = Path(directory)
        self.where = str(self._directory)

    @property
    def directory(self) -> Path:
        return self._directory

    def make_durable(self, batch: Batch) -> None:
        for path in batch.media:
            fsync_path(path)  # the linked bytes (run media are not fsynced when stored)
        if batch.media or batch.new_entries:
            fsync_path(str(self.directory / MEDIA_DIR), directory=True)
            fsync_path(str(self.directory), directory=True)
        fsync_started = time.monotonic()
        if batch.fd is not None:
            os.fdatasync(batch.fd)
        batch.stats.fsync_s = time.monotonic() - fsync_started
        fault_point("journal.synced", batch.seq)
        if batch.fd is not None:  # after the fsync: a mark never precedes what it says is durable
            mark = sync_mark(batch.seq)
            os.write(batch.fd, mark)
            batch.appended = len(mark)
        self._done(batch)

    def free(self, index: SegmentIndex, upto: int, active: Path | None) -> Freed:
        """The covered segments and the media only they referenced, deleted now (under the
        writer's locks: a record encoded after this places a screenshot it names again)."""
        segments, names = index.compact_files(upto, active)
        freed = Freed(len(segments), forget=list(names))
        for path in segments:
            fault_point("journal.compact", path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / MEDIA_DIR / name)
                freed.media += 1
        return freed

    def existing(self, lineage: str, known: Callable[[Path], bool]) -> Iterator[Adopted]:
        for path in sorted(self.directory.glob(f"{SEGMENT_PREFIX}*-{lineage}-*{SEGMENT_SUFFIX}")):
            if known(path):
                continue  # written by this journal: indexed as it was written
            scan = scan_journal(self.directory, lineage=lineage, decode_bodies=False, only=[path])
            if scan.records:
                media = {m for r in scan.records for m in r.media}
                yield Adopted(path, scan.records[0].seq, scan.records[-1].seq, media)

    def exists(self) -> bool:
        return self.directory.is_dir()

    def readable(self, staging: Callable[[], Path], *, must_reach: str | None = None, why: str = "") -> Path:
        return self.directory  # a directory's listing does not lag its writes: nothing to wait for

    @property
    def name(self) -> str:
        return self.directory.name

    def child(self, rel: str) -> LocalFiles:
        return LocalFiles(self.directory / rel)

    def parent(self) -> LocalFiles:
        return LocalFiles(self.directory.parent)
