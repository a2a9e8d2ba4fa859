"""The one table of limits: every size and count taken from an untrusted file is bounded here.

A bundle (and a rollout journal, and a ``<bundle>.replay.json``) may come from anyone. Each number
a reader takes from such a file before it spends memory, time or descriptors on it (a media
``size``, a count of turns, a text's length, an image's pixels, a JSON document's depth, an id) is
checked against a row of this table first, and the writer checks the same row before it makes the
file durable: what a reader would refuse is never written. A limit is a module constant, so that
the writer and the reader import the same object and cannot drift; :data:`LIMITS` lists them
all, by name, for docs/FORMAT.md §8 ("Limits") and for the tests that check both sides refuse
alike.

Rows are grouped by who enforces them: the format (every reader and writer of a bundle), the
presentation (what one page or one command line shows: ``view``, ``serve``, ``ls``), and the
rollout journal (``trainer_hooks`` imports these through :mod:`bundles.support`).
"""

from __future__ import annotations

__all__ = [
    "LIMITS",
    "MAX_CONSUMED_GROUPS",
    "MAX_CURSOR_BYTES",
    "MAX_DECODE_PIXELS",
    "MAX_EXPORT_PART_BYTES",
    "MAX_EXPORT_SAMPLE_IMAGE_BYTES",
    "MAX_FIND_DEPTH",
    "MAX_GROUP_ID",
    "MAX_GROUP_SIZE",
    "MAX_ID_CHARS",
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_MEDIA_BYTES",
    "MAX_MEDIA_COUNT",
    "MAX_NESTING_DEPTH",
    "MAX_PAGE_PIXELS",
    "MAX_POINTER_BYTES",
    "MAX_READ_TASKS",
    "MAX_RECORD_BODY_BYTES",
    "MAX_RECORD_MEDIA",
    "MAX_RECORD_META_BYTES",
    "MAX_REPORT_BYTES",
    "MAX_SAMPLE_ITEMS",
    "MAX_SAMPLE_RAW_BYTES",
    "MAX_SHARD_COUNT",
    "MAX_SHARD_RAW_BYTES",
    "MAX_SHIPMENT_BYTES",
    "MAX_SHIPMENT_MEDIA",
    "MAX_SHOWN_CHARS",
    "MAX_SHOWN_NAME_CHARS",
    "MAX_SHOWN_PATH_CHARS",
    "MAX_SHOWN_TURNS",
]

# -- the format -----------------------------------------------------------------------------------
#: A manifest (``manifest.json``) is at most this many bytes.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: A store pointer (``bundle.json``) is at most this many bytes.
MAX_POINTER_BYTES = 64 * 1024
#: One shard decompresses to at most this many bytes.
MAX_SHARD_RAW_BYTES = 16 * 1024**3
#: Nested containers of a sample, and of any JSON document a reader parses (manifest, pointer,
#: replay report), at most this deep.
MAX_NESTING_DEPTH = 64
MAX_JSON_DEPTH = MAX_NESTING_DEPTH
#: Every int of a manifest (counts, sizes) is below 2**63: len() and sums of them cannot overflow.
MAX_INT = 2**63 - 1
#: One sample: at most this many msgpack bytes, and this many items (every element of a list,
#: tuple or map, plus one per container), so that decoding one sample needs bounded memory
#: whatever a shard declares (docs/FORMAT.md §8).
MAX_SAMPLE_RAW_BYTES = 1024**3
MAX_SAMPLE_ITEMS = 2**24
#: One media file is at most this many bytes (a manifest's ``size`` above it is refused before a
#: byte is read or a buffer sized from it).
MAX_MEDIA_BYTES = 16 * 1024**3
#: A manifest lists at most this many media files and this many shards.
MAX_MEDIA_COUNT = 1 << 24
MAX_SHARD_COUNT = 1 << 20
#: An image is decoded only when its header declares at most this many pixels.
MAX_DECODE_PIXELS = 16384 * 16384
#: An id a reader keys anything by (a run id, a prompt id, a task id), in characters.
MAX_ID_CHARS = 256

# -- the presentation: what one page or one line costs --------------------------------------------
#: Characters of one text (a prompt, a response, a turn's action) shown, and parsed, on a page;
#: the rest is cut before any parser or regex sees it.
MAX_SHOWN_CHARS = 20_000
#: Characters of a name (a path, a key, a meta value) shown on a terminal line or a page.
MAX_SHOWN_NAME_CHARS = 300
#: Turns of one sample shown on one page; the rest are counted.
MAX_SHOWN_TURNS = 200
#: Pixels decoded for one page, all its pictures together; past it a picture is named, not drawn.
MAX_PAGE_PIXELS = 64 * 1024 * 1024
#: A replay report (``<bundle>.replay.json``) read beside a bundle, in bytes.
MAX_REPORT_BYTES = 16 * 1024 * 1024
#: Characters of a location (a path, a URL) ``ls`` prints on its line: whole paths, cut only past
#: what a file system holds (PATH_MAX).
MAX_SHOWN_PATH_CHARS = 4096
#: Directory (or prefix) levels ``ls -r`` and serve's run listing look below a root
#: (``run/ckpt/rollout/fully_async_3`` is 3 below ``run/``).
MAX_FIND_DEPTH = 4
#: Bytes of screenshots one sample's row holds when exported with its images (``to_arrow(media=True)``,
#: ``export --with-images``): a sample may reference one stored file any number of times.
MAX_EXPORT_SAMPLE_IMAGE_BYTES = 256 * 1024 * 1024
#: Bytes of one exported part published to a store: it is read into memory for its single put.
MAX_EXPORT_PART_BYTES = 4 * 1024**3
#: Read tasks ``read_bundles`` makes, one per shard of the run's bundles (each task's descriptor is
#: held by the driver and by Ray's plan).
MAX_READ_TASKS = 1_000_000

# -- the rollout journal (enforced by trainer_hooks' writer and reader alike) ---------------------
#: A data source's cursor recorded in a take, encoded, in bytes.
MAX_CURSOR_BYTES = 1 << 20
#: A group id is a non-negative int at most this (it is packed and compared as a signed 64-bit int).
MAX_GROUP_ID = 2**63 - 1
#: A group's size, and a sibling's index in it, at most this.
MAX_GROUP_SIZE = 1 << 20
#: Group ids one ``consumed`` record names (the groups handed to one training step), at most this.
MAX_CONSUMED_GROUPS = 1 << 16
#: Media file names one record references, at most this.
MAX_RECORD_MEDIA = 1 << 15
#: One record's meta (``[seq, kind, at, a, b, media]``, msgpack), in bytes: room for every field
#: of every kind at its bound at once (a cursor of MAX_CURSOR_BYTES, MAX_RECORD_MEDIA names of at
#: most 117 bytes, MAX_CONSUMED_GROUPS ids of 9 bytes; tests/test_journal_limits.py checks), so a
#: record the writer accepts field by field always fits. A segment's header is bounded by it too.
MAX_RECORD_META_BYTES = 8 << 20
#: One record's body (a zstd frame of one sample or group), in bytes, compressed; decompressed it
#: is at most MAX_SAMPLE_RAW_BYTES (what the bundle codec decodes).
MAX_RECORD_BODY_BYTES = 1 << 30
#: One shipment of a journal on a store (a segment and the media it brings), in bytes, and the
#: media files it carries; the writer ships early, before either is reached.
MAX_SHIPMENT_BYTES = 4 << 30
MAX_SHIPMENT_MEDIA = 1 << 16

#: Every limit above, by name: the table docs/FORMAT.md §8 prints and the tests walk.
LIMITS: dict[str, int] = {
    name: value for name, value in globals().items() if name.startswith("MAX_") and isinstance(value, int)
}
