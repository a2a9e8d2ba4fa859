"""One sample in the bundle codec, outside a bundle: for logs that must read back what bundles store.

A bundle's shards are zstd streams of samples encoded by :class:`bundles._format.encoder.SampleEncoder`
(docs/FORMAT.md §3). A write-ahead log of samples (``trainer_hooks``' rollout journal) wants the
very same encoding, record by record, so that what it holds is exactly what a checkpoint bundle
would hold and is decoded by the same closed set of types. These two functions are that codec's
public face; they add nothing to it:

* :func:`encode_sample` packs one sample (:func:`sample_encoder`: many, with one encoder); the caller says which strings and ``MediaRef`` values
  are media and what reference each becomes (the bundle writer's job, done here by the caller).
* :func:`decode_sample` unpacks one sample's bytes with the format's per-sample limits; references
  resolve to the ``MediaRef`` values of ``media`` (by stored file name, ``<hex><suffix>``), a
  path reference to the string of that ref's ``path``.

Errors: :class:`UnsupportedValueError` (encoding) and :class:`BundleFormatError` /
:class:`UnsafeBundleError` (decoding), naming ``where`` and the key path when it can be found.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol

import msgpack

from bundles._errors import BundleFormatError, UnsafeBundleError, UnsupportedValueError
from bundles._format.codec import gc_paused
from bundles._format.decoder import Defect, SampleDecoder, find_defect
from bundles._format.encoder import SampleEncoder
from bundles._format.layout import MAX_SAMPLE_RAW_BYTES
from bundles._format.media import MediaRef

__all__ = ["decode_sample", "encode_sample", "sample_encoder"]


class SampleEncodeFn(Protocol):
    """What :func:`sample_encoder` returns."""

    def __call__(self, sample: Any, where: str = "sample", *, number_lists: Container[int] = ()) -> bytes: ...


def _no_ref(value: MediaRef, where: str) -> MediaRef:
    raise UnsupportedValueError(f"{where}: a MediaRef can be encoded only with a resolve_ref callback")


def sample_encoder(
    *,
    resolve_string: Callable[[str, str], MediaRef | None] | None = None,
    string_prefixes: tuple[str, ...] | None = None,
    resolve_ref: Callable[[MediaRef, str], MediaRef] | None = None,
    store_image: Callable[[Any, str], MediaRef] | None = None,
) -> SampleEncodeFn:
    """A reusable ``encode(sample, where, *, number_lists=()) -> bytes``: :func:`encode_sample`
    with one encoder kept across samples (building one costs more than encoding a small sample).
    Record types registered after this call are not known to it.

    ``number_lists``: the ids of lists inside ``sample`` that the caller has already proved hold
    only ints, floats and bools (:func:`bundles.support.only_numbers`, say in a snapshot's type
    check); they are packed without a second proof. Those lists must stay alive and unchanged
    until ``encode`` returns (an id names an object only while it lives)."""
    if resolve_string is None:
        encoder = SampleEncoder(lambda v, w: None, resolve_ref or _no_ref, (), store_image)
    else:
        encoder = SampleEncoder(resolve_string, resolve_ref or _no_ref, string_prefixes, store_image)

    def encode(sample: Any, where: str = "sample", *, number_lists: Container[int] = ()) -> bytes:
        # The collector is paused while the sample's containers are built (see gc_paused;
        # inlined: this runs once per sample).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return encoder.encode(sample, where, number_lists)
        finally:
            if was_enabled:
                gc.enable()

    return encode


def encode_sample(
    sample: Any,
    *,
    where: str = "sample",
    resolve_string: Callable[[str, str], MediaRef | None] | None = None,
    string_prefixes: tuple[str, ...] | None = None,
    resolve_ref: Callable[[MediaRef, str], MediaRef] | None = None,
    store_image: Callable[[Any, str], MediaRef] | None = None,
) -> bytes:
    """The msgpack bytes of one sample (a dict, or anything the codec stores), as a shard holds it.

    ``resolve_string(value, where)`` is offered the strings that start with one of
    ``string_prefixes`` (every string when ``string_prefixes`` is None and ``resolve_string`` is
    given, none when ``resolve_string`` is None) and returns the complete ``MediaRef`` the string
    references, or None to keep it a string. ``resolve_ref(ref, where)`` returns a complete
    ``MediaRef`` for each one met (without it a ``MediaRef`` is refused). ``store_image(image,
    where)`` stores a PIL image and returns its reference (without it a PIL image is refused).
    Use :func:`sample_encoder` to encode many samples with the same callbacks.
    """
    encode = sample_encoder(
        resolve_string=resolve_string,
        string_prefixes=string_prefixes,
        resolve_ref=resolve_ref,
        store_image=store_image,
    )
    return encode(sample, where)


def decode_sample(data: bytes, media: Mapping[str, MediaRef], *, where: str = "sample") -> Any:
    """The sample held by ``data`` (bytes from :func:`encode_sample`); ``media`` maps stored file
    names to the ``MediaRef`` each reference becomes (its ``path`` is the string a path reference
    becomes). Refuses trailing bytes, unknown references and anything beyond the format's limits."""
    if len(data) > MAX_SAMPLE_RAW_BYTES:
        raise UnsafeBundleError(f"{where}: {len(data)} bytes; the format allows {MAX_SAMPLE_RAW_BYTES}")
    decoder = SampleDecoder(media)
    unpacker = decoder.unpacker(max(len(data), 1))
    unpacker.feed(data)
    try:
        with gc_paused():
            obj = unpacker.unpack()
    except Defect as d:
        if not d.locate:
            raise UnsafeBundleError(f"{where}: {d.message}") from None
        raise _located(data, media, where, d) from None
    except msgpack.OutOfData:
        raise BundleFormatError(f"{where}: truncated: the bytes end inside the sample") from None
    except Exception as e:  # msgpack's ValueError subclasses, TypeError (unhashable keys)
        raise BundleFormatError(f"{where}: malformed msgpack: {e}") from None
    if unpacker.tell() != len(data):
        raise BundleFormatError(f"{where}: {len(data) - unpacker.tell()} bytes after the sample")
    return obj


def _located(data: bytes, media: Mapping[str, MediaRef], where: str, defect: Defect) -> BundleFormatError:
    try:
        lenient = SampleDecoder(media, lenient=True)
        unpacker = lenient.unpacker(max(len(data), 1))
        unpacker.feed(data)
        found = find_defect(unpacker.unpack(), where)
    except Exception:
        found = None
    if found is None:
        return BundleFormatError(f"{where}: {defect.message}")
    return BundleFormatError(f"{found[0]}: {found[1]}")
