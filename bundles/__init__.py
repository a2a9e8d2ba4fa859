"""Self-contained, verifiable bundles of rollout samples and the media they reference.

A bundle is a directory: a manifest, msgpack+zstandard sample shards, and every referenced
media file stored once by content digest; or the same on an object store (``s3://``, ``gs://``,
``az://`` with the ``rollout-bundles[s3]`` extra). See docs/FORMAT.md for the format.
:func:`read_bundles` reads a run's bundles as a ``ray.data.Dataset`` (ray imported when called).

This module is the format API. Tools built on bundles (trainer_hooks, the CLI) also use
:mod:`bundles.support`: the atomic write, the tree deletion, process identity, fault points,
progress and the CLI kit.
"""

from bundles import _errors
from bundles._api.entry import (
    child_location,
    is_bundle,
    list_bundles,
    open_bundle,
    pack_bundle,
    remove_bundle,
    unpack_bundle,
    write_bundle,
)
from bundles._api.location import Location
from bundles._commands.datasets import read_bundles
from bundles._errors import *  # noqa: F403  (the exception hierarchy, whole)
from bundles._format.images import DECODABLE_IMAGE_FORMATS, MAX_DECODE_PIXELS, decode_image
from bundles._format.layout import FORMAT_VERSION, PACK_SUFFIX
from bundles._format.manifest import Manifest, MediaEntry, ShardEntry
from bundles._format.media import MediaRef
from bundles._format.options import LinkMode, OutsidePolicy, Verify
from bundles._format.records import Record, register_record_type
from bundles._format.sample import decode_sample, encode_sample, sample_encoder
from bundles._local.reader import Bundle
from bundles._store import (
    GarbageReport,
    StorePrefix,
    UploadStats,
    collect_garbage,
    list_remote_bundles,
    upload_bundle,
)
from bundles._urls import StoreURL, check_location, is_store_url
from bundles._version import __version__

__all__ = [
    "DECODABLE_IMAGE_FORMATS",
    "FORMAT_VERSION",
    "MAX_DECODE_PIXELS",
    "PACK_SUFFIX",
    "Bundle",
    "GarbageReport",
    "LinkMode",
    "Location",
    "Manifest",
    "MediaEntry",
    "MediaRef",
    "OutsidePolicy",
    "Record",
    "ShardEntry",
    "StorePrefix",
    "StoreURL",
    "UploadStats",
    "Verify",
    "__version__",
    "check_location",
    "child_location",
    "collect_garbage",
    "decode_image",
    "decode_sample",
    "encode_sample",
    "is_bundle",
    "is_store_url",
    "list_bundles",
    "list_remote_bundles",
    "open_bundle",
    "pack_bundle",
    "read_bundles",
    "register_record_type",
    "remove_bundle",
    "sample_encoder",
    "unpack_bundle",
    "upload_bundle",
    "write_bundle",
]
# The exceptions: bundles._errors' __all__ is the one list of them.
__all__ += _errors.__all__


# Deprecated aliases, kept for one release: these moved to bundles.support (not the format API).
def __getattr__(name: str) -> object:
    from bundles._deprecated import moved_to_support
    from bundles._local.commit import scratch_dir

    return moved_to_support("bundles", {"scratch_dir": scratch_dir}, name)
