"""Sample encoding: msgpack with extension types, never pickle.

JSON-like values map to msgpack's own types; everything else the format supports becomes an
extension type (see ``_layout.EXT_*`` and docs/FORMAT.md §3):

* ``MediaRef`` anywhere, and ``str`` values that are absolute paths inside a media root, become
  references by digest. The writer decides which strings are references through a callback, so
  this module knows nothing about files.
* tuples, numpy arrays and scalars of numeric or bool dtype, and torch tensors of the dtypes in
  ``layout.TORCH_DTYPES`` (bfloat16 included) round-trip exactly. torch is imported only when
  a tensor is met.

Extensions are dispatched through tables of the classes' own functions, called with the encoder
or decoder (:attr:`SampleEncoder.ext_by_type`, :attr:`SampleEncoder.ext_by_class`, and
``decoder._EXT_HANDLERS`` by extension code), so a new one is a new entry in each direction. The
tables hold no bound method: a codec holding its own bound methods is a reference cycle, and a
cycle keeps what the codec holds (the writer's resolvers; the reader's ``open_media``, hence a
packed bundle's descriptor) alive until the garbage collector runs.

This module holds what both directions share (the pause of the collector, the proof that a list
holds only numbers, key paths, the types that need a closer look); :mod:`.encoder` and
:mod:`.decoder` hold the two directions.

**Cost model: no Python call per element.** A sample of a long rollout is mostly three flat
lists (token ids, loss mask, log-probs) of thousands of numbers, and msgpack handles those at C
speed; the codec must not visit their elements in Python.

* Encoding walks the containers of a sample (dicts, lists, tuples), not the numbers in them. A
  list is proved to hold only numbers by :func:`only_numbers` (C speed) and handed to the packer
  as it is. The packer is msgspec's (``msgspec.msgpack.Encoder``): for every value the walk
  lets through it writes the bytes msgpack's ``packb(use_bin_type=True)`` writes (the smallest
  int width, float64, bin for bytes, maps in insertion order) at ~3x its speed, so bundles
  written before and after are the same bytes (tests/vectors and a property test pin it).
  Whatever could slip through the proof (an ``int`` subclass, an int beyond 64 bits) makes it
  raise; only then does a second walk, item by item, name the value. The one kind of int it
  packs as an int is an enum member (``IntEnum``, ``IntFlag``): the walk stores those as their
  values too, so one comes back as its int wherever it sat. Any other unsupported type raises
  :class:`UnsupportedValueError` naming the key path. Decoding stays with msgpack, whose hooks
  msgspec lacks and which decodes no slower (a column path, msgspec reading a sample's top-level
  map as raw fields and its number lists typed, the rest through the hooks, measured 23 µs a
  sample against 21: the number lists' objects are the cost, not their hooks; docs/PERFORMANCE.md,
  "Export to Parquet").
* Decoding resolves extensions where msgpack meets them: ``ext_hook`` turns a reference into the
  stored file (looked up in the manifest's media once per distinct reference), and builds arrays,
  tensors and tuples. ``list_hook`` and ``object_hook`` run once per container: they count the
  sample's items, check map keys, refuse msgpack timestamps and compute each container's height
  from its children's (bottom-up, so no recursion), again proving number lists at C speed.
  A problem raises :class:`Defect` without a key path; the shard reader then decodes that one
  sample again leniently (problems become :class:`Bad` markers) and walks it to name the key path:
  the only walk over plain values, and it happens only on failure.

Decoding builds only the closed set of types above: opening a bundle cannot run code from the file.
Dict keys keep their insertion order: the same input gives the same bytes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from bundles._format.media import MediaRef


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while encoding or decoding many containers.

    Encoding and decoding build thousands of dicts and lists and no reference cycles; each
    allocation burst triggers collections that walk every tracked object of the process (with
    torch imported, hundreds of thousands), which made a save up to twice as slow. msgpack's own
    documentation recommends the same. The pause is process-wide and lasts one save or one sample.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


INT_MIN = -(2**63)
UINT_MAX = 2**64 - 1
NUMERIC_KINDS = frozenset("biufc")
NUMBER_TYPES = frozenset({int, float, bool})
SUM_TYPES = frozenset({int, float})
KEY_TYPES = frozenset({str, int})
CONTAINERS = frozenset({list, dict, tuple})
# Values whose presence in a container needs a closer look when decoding.
NOTABLE = CONTAINERS | {msgpack.Timestamp}
TIMESTAMP_MESSAGE = "msgpack timestamps are not a value bundles store"

StringRefResolver = Callable[[str, str], "MediaRef | None"]
MediaRefResolver = Callable[[MediaRef, str], MediaRef]
# Stores a PIL image as a media file and returns its complete reference (the writer's job).
ImageStore = Callable[[Any, str], MediaRef]


def only_numbers(items: list[Any]) -> bool:
    """True when ``items`` holds only ints, floats and bools; proved at C speed.

    Long lists are summed: ``sum()`` adds in C (fast paths for ints and floats, ~3 ns an item
    against ~20 for ``set(map(type, items))``), raises at the first str, None, bytes or container,
    and its result is an exact ``int`` or ``float`` only when every item is an int, float or bool
    (numpy scalars, arrays and tensors give numpy or torch values). Lists whose first, middle or
    last item is anything else are not summed, so a list of tensors is never added up. An ``int``
    subclass (say an ``IntEnum``) inside a long list passes; msgpack's strict packer refuses it,
    which is why the encoder has a second walk.

    A numpy scalar hidden elsewhere in a long list of Python numbers is summed with them: the
    result is a numpy value, so the answer is still False, but numpy may print an overflow
    warning for it (silencing that with ``np.errstate`` costs ~2 us a list, more than the sum).
    """
    n = len(items)
    if n < _SUM_FROM:
        return NUMBER_TYPES.issuperset(map(type, items))
    if (
        type(items[0]) not in NUMBER_TYPES
        or type(items[-1]) not in NUMBER_TYPES
        or type(items[n // 2]) not in NUMBER_TYPES
    ):
        return False
    try:
        return type(sum(items)) in SUM_TYPES
    except Exception:  # TypeError at the first non-number; numpy/torch may raise others
        return False


# Below this length, checking each item's type costs less than a sum's setup.
_SUM_FROM = 64


# The ".key" / "[key]" part of a key path, per key: a save builds one key path per nested value
# of every sample, and samples repeat their keys. Bounded: arbitrary keys never grow it past this.
KEY_PART_CACHE_MAX = 4096
_key_parts: dict[tuple[type, object], str] = {}


def key_path(parent: str, key: object) -> str:
    cache_key = (type(key), key)
    part = _key_parts.get(cache_key)
    if part is None:
        part = f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
        if len(_key_parts) < KEY_PART_CACHE_MAX:
            _key_parts[cache_key] = part
    return parent + part
