"""A shard of a bundle on an object store, copied into an unnamed temporary file to be read.

A remote shard is read once from the store, in its source's ranges, into a file that has no
name (``O_TMPFILE`` where the filesystem has it: nothing is left in ``TMPDIR`` after a crash),
then hashed and decoded from there as a local shard is (:func:`bundles._format.shards.digest_problem`
reads it twice: from the page cache, not the network). Trade-off: memory holds a range, not the
compressed shard (up to ~50 MB: issue 39, item 6), and the disk holds the shard while it is
decoded (on a tmpfs ``TMPDIR``, memory again).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from typing import BinaryIO

from bundles._errors import BundleIOError
from bundles._local.faults import fault_point

__all__ = ["spill_shard"]


def spill_shard(f: BinaryIO, size: int, where: str) -> BinaryIO:
    """A remote shard copied into an unnamed temporary file (``TMPDIR``), read once from the
    store in the source's ranges (8 MiB), at most ``size + 1`` bytes; it is then hashed and
    decoded as a local shard is. Memory holds a range, not the compressed shard (up to ~50 MB:
    issue 39, item 6); the disk holds the shard while it is decoded (on a tmpfs ``TMPDIR``,
    memory again), and one GET pass is made, not two. Where no temporary file can be made (no
    usable ``TMPDIR``: a read-only container) the shard is held in memory, as before. A store's
    error while reading passes as it is; a failure to write the copy names the shard."""
    spill: BinaryIO
    try:
        spill = tempfile.TemporaryFile(prefix="rollout-shard-")  # noqa: SIM115 (returned open)
    except OSError:
        spill = io.BytesIO()
    try:
        with f:
            left = size + 1
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                _write(spill, chunk, where)
                left -= len(chunk)
                fault_point("read.spilled", where)
        _write(spill, b"", where)  # what the file's buffer still holds (a shard under its 4 KiB)
        spill.seek(0)
    except BaseException:
        with contextlib.suppress(OSError):  # its flush would fail again, hiding the error above
            spill.close()
        raise
    return spill


def _write(spill: BinaryIO, chunk: bytes, where: str) -> None:
    """``chunk`` written to the temporary copy (flushed when empty); a full or refused
    ``TMPDIR`` names the shard and the directory."""
    try:
        if chunk:
            spill.write(chunk)
        else:
            spill.flush()
    except OSError as e:
        raise BundleIOError.wrap(where, "copy it into a temporary file (TMPDIR) to read it", e) from e
