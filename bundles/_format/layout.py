"""Every name and number that appears on disk, in one place (see docs/FORMAT.md).

Changing any value here changes the bytes of a bundle: bump ``FORMAT_VERSION`` and update
``tests/vectors/`` and CHANGELOG.md in the same commit.
"""

from __future__ import annotations

import re

# The names of staging and retired directories: defined in bundles/_errors.py, which names a
# path inside one as the destination it stands for (re-exported here, with every name on disk).
from bundles._errors import RETIRED_MARKER, STAGING_MARKER, STAGING_RE  # noqa: F401

# Limits a reader enforces before trusting a file: the one table is bundles/_format/limits.py (re-exported).
from bundles._format.limits import (  # noqa: F401  (re-exported)
    MAX_INT,
    MAX_MANIFEST_BYTES,
    MAX_NESTING_DEPTH,
    MAX_SAMPLE_ITEMS,
    MAX_SAMPLE_RAW_BYTES,
    MAX_SHARD_RAW_BYTES,
)

FORMAT_NAME = "rollout-bundle"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})

MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "samples"
MEDIA_DIR = "media"
SHARD_SUFFIX = ".msgpack.zst"
SHARD_NAME_FORMAT = "{index:06d}" + SHARD_SUFFIX
SHARD_PATH_RE = re.compile(r"samples/[0-9]{6}\.msgpack\.zst")

# A packed bundle is one uncompressed POSIX tar of the bundle directory.
PACK_SUFFIX = ".rbundle"

DIGEST_ALGORITHM = "sha256"
DIGEST_PREFIX = "sha256:"
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
HEX_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
# One to three dot-separated parts, e.g. ".png", ".tar.gz"; no path separators by construction.
SUFFIX_RE = re.compile(r"(\.[A-Za-z0-9_-]{1,16}){0,3}")

# msgpack extension type codes used in sample shards.
EXT_MEDIA_REF = 1  # a MediaRef: [digest, size, suffix]
EXT_PATH_REF = 2  # a plain string path into a media root: [digest, size, suffix]
EXT_TUPLE = 3  # a tuple: packed list
EXT_NDARRAY = 4  # header [dtype.str, shape] packed, then the raw bytes
EXT_NPSCALAR = 5  # header [dtype.str] packed, then the raw bytes
EXT_TENSOR = 6  # header [torch dtype name, shape] packed, then the raw little-endian bytes
EXT_RECORD = 7  # a registered frozen dataclass (or a Record): packed [name, {field: value}]
EXT_IMAGE = 8  # a PIL image stored as a PNG media file: [digest, size, suffix]

# The torch dtypes extension 6 may name: the only names a reader looks up in torch (never
# getattr(torch, <name from a file>): "_inductor" imports hundreds of modules). Quantized, bit
# and complex32 types are not stored.
TORCH_DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
)

# Writers close a shard once its encoded samples pass this size.
SHARD_TARGET_RAW_BYTES = 64 * 1024 * 1024
# Level 1: on token ids and log-probs it compresses within 2 % of level 3 at a quarter of the time.
ZSTD_LEVEL = 1

# Files are written with these modes; stored media are read-only.
MEDIA_MODE = 0o444
FILE_MODE = 0o444
DIR_MODE = 0o755

# A bundle's kind, e.g. "debug_dump" or "rollout_checkpoint"; checked on write and on read.
KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
MANIFEST_KEYS_REQUIRED = ("format", "format_version", "kind", "meta", "sample_count", "shards", "media")

# Bundles on an object store (docs/FORMAT.md §9): the pointer object at the bundle's URL, the
# generations it names, and the media pool shared by the bundles beside one another.
STORE_POINTER_NAME = "bundle.json"
STORE_POINTER_FORMAT = "rollout-bundle-pointer"
STORE_POINTER_VERSION = 1
STORE_GENERATION_RE = re.compile(r"g[0-9]{8}T[0-9]{12}Z-[0-9a-f]{12}")
STORE_MEDIA_POOL = ".media"
