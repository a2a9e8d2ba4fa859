"""Self-contained, verifiable bundles of rollout samples and the media they reference.

A bundle is a directory: a manifest, msgpack+zstandard sample shards, and every referenced
media file stored once by content digest. See docs/FORMAT.md for the on-disk format.
"""

from bundles._commit import is_bundle, remove_bundle, scratch_dir
from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleIndexError,
    BundleIOError,
    BundleNotFoundError,
    BundleReplacedError,
    BundleVerificationError,
    MediaMissingError,
    OutsidePathError,
    OutsidePathWarning,
    UnsafeBundleError,
    UnsupportedValueError,
)
from bundles._layout import FORMAT_VERSION, PACK_SUFFIX
from bundles._media import MediaRef
from bundles._pack import pack_bundle, unpack_bundle
from bundles._pil import DECODABLE_IMAGE_FORMATS, MAX_DECODE_PIXELS, decode_image
from bundles._reader import Bundle, open_bundle
from bundles._records import Record, register_record_type
from bundles._sample_codec import decode_sample, encode_sample
from bundles._writer import write_bundle

__version__ = "0.1.0"

__all__ = [
    "DECODABLE_IMAGE_FORMATS",
    "FORMAT_VERSION",
    "MAX_DECODE_PIXELS",
    "PACK_SUFFIX",
    "Bundle",
    "BundleError",
    "BundleExistsError",
    "BundleFormatError",
    "BundleIOError",
    "BundleIndexError",
    "BundleNotFoundError",
    "BundleReplacedError",
    "BundleVerificationError",
    "MediaMissingError",
    "MediaRef",
    "OutsidePathError",
    "OutsidePathWarning",
    "Record",
    "UnsafeBundleError",
    "UnsupportedValueError",
    "__version__",
    "decode_image",
    "decode_sample",
    "encode_sample",
    "is_bundle",
    "open_bundle",
    "pack_bundle",
    "register_record_type",
    "remove_bundle",
    "scratch_dir",
    "unpack_bundle",
    "write_bundle",
]
