"""The exception hierarchy of :mod:`bundles`.

Every error the package raises derives from :class:`BundleError`; where a built-in
exception describes the situation too, the subclass mixes it in, so that callers who
already catch ``FileNotFoundError`` or ``ValueError`` keep working.

Messages name the bundle (or file) path, the key path of the value inside a sample
(``samples[3].multimodal_inputs.images[1]``), what was expected and what was found.

Every error and warning class of the package lives here, the store client's own included (those
are not in ``__all__``, which :mod:`bundles` re-exports whole). Beside them what naming a path or
pointing a warning needs, so that this module imports nothing of the package: the names of
staging and retired directories (a path inside one is named as the destination it stands for;
:mod:`bundles._format.layout` re-exports them) and :func:`stacklevel_outside_bundles`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

__all__ = [
    "BucketNotFoundError",
    "BundleError",
    "BundleExistsError",
    "BundleFormatError",
    "BundleIOError",
    "BundleIndexError",
    "BundleNotFoundError",
    "BundleReplacedError",
    "BundleVerificationError",
    "GarbagePrefixError",
    "MediaMissingError",
    "OutsidePathError",
    "OutsidePathWarning",
    "UnsafeBundleError",
    "UnsafeStoreError",
    "UnsafeStoreWarning",
    "UnsupportedLocationError",
    "UnsupportedValueError",
]


# Staging directories live beside the destination, named after the writer:
# ".<dest name>.staging.<host>.<boot>.<pid namespace>.<pid>.<random>" (boot: the first 12 hex
# digits of the boot id, pid namespace: its inode number; 0 where unknown). Names written before
# 0.2 lack <boot>.<pid namespace>; they are still recognised (never read as bundles), never
# cleaned up automatically.
STAGING_MARKER = ".staging."
# Where ``overwrite=True`` and ``remove_bundle`` park a previous bundle until it is removed.
RETIRED_MARKER = ".retired."
STAGING_RE = re.compile(
    r"\.(?P<dest>.+)\.(?P<kind>staging|retired)\.(?P<host>[^.]+)"
    r"(?:\.(?P<boot>[0-9a-f]+)\.(?P<pidns>[0-9]+))?\.(?P<pid>[0-9]+)\.(?P<nonce>[0-9a-f]+)"
)


class BundleError(Exception):
    """Root of every error raised by :mod:`bundles`."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """The path holds no bundle (no directory, or no manifest inside it)."""


class BucketNotFoundError(BundleNotFoundError):
    """The bucket (or container) of an object-store URL does not exist: create it first (the
    library never creates buckets)."""


class BundleExistsError(BundleError, FileExistsError):
    """The destination exists and ``overwrite`` was not given."""


class BundleFormatError(BundleError, ValueError):
    """A file of the bundle does not follow the format (see docs/FORMAT.md)."""


class BundleIndexError(BundleError, IndexError):
    """A sample index is out of range (``bundle[i]``, ``bundle.samples(indices=...)``)."""


class UnsafeBundleError(BundleFormatError):
    """A bundle or packed file tries to escape its directory, holds a link or a special file,
    or exceeds a size limit."""


def public_path(path: object) -> object:
    """``path`` with each staging or retired directory (or staged temporary file) named as the
    destination it stands for, and a writer's temporary media name (``.ingest-<n>``) dropped:
    ``/r/.b.staging.host.ab12.4026.77.9f/media/.ingest-3`` reads ``/r/b/media``. Anything that
    is not a path string is returned as it is."""
    if not isinstance(path, str):
        return path
    parts = path.split("/")
    out: list[str] = []
    for part in parts:
        m = STAGING_RE.fullmatch(part)
        if m is not None:
            out.append(m["dest"])
        elif part.startswith(".ingest-"):
            break  # a temporary media name inside media/: its directory is what to name
        else:
            out.append(part)
    return "/".join(out)


class BundleIOError(BundleError, OSError):
    """The filesystem refused a read or a write (no space left, file too large, permission
    denied, I/O error). The message names the bundle and the file; the original ``OSError`` is
    ``__cause__`` and its ``errno`` is kept. A failed write leaves nothing at its destination."""

    @classmethod
    def wrap(cls, dest: object, what: str, error: OSError) -> BundleIOError:
        """``"<dest>: cannot <what>: [Errno N] <reason>: '<file>'"``; the file is named as the user
        knows it: a staging directory or temporary file name (``.b.staging.<host>...``,
        ``media/.ingest-3``) is never shown, the path it stands for is."""
        filename = public_path(error.filename)
        filename2 = public_path(error.filename2)
        if error.strerror and filename is not None:
            shown: object = OSError(error.errno, error.strerror, filename, None, filename2)
        else:
            shown = error
        err = cls(f"{dest}: cannot {what}: {shown}")
        err.errno = error.errno
        err.strerror = error.strerror
        err.filename = filename
        return err

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedValueError(BundleError, TypeError):
    """A sample holds a value that the format cannot store without pickle."""


class UnsupportedLocationError(BundleError, ValueError):
    """A location is a URL whose scheme is not supported, or whose optional dependency is not
    installed (the message names the scheme and the extra to install); never a local path."""


class MediaMissingError(BundleError, FileNotFoundError):
    """A sample references a media file that does not exist or disagrees with its reference."""


class OutsidePathError(BundleError, ValueError):
    """A sample holds an absolute path string to a file outside the media roots, and the writer
    was asked (``outside_paths="error"``) to refuse paths that would dangle."""


class OutsidePathWarning(UserWarning):
    """A bundle keeps absolute path strings to files outside its media roots: they dangle once
    those files are gone (``write_bundle(outside_paths="warn")``, the default)."""


class BundleVerificationError(BundleError):
    """Verification found problems; ``problems`` lists every one, not just the first."""

    def __init__(self, path: object, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = list(problems)
        shown = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{path}: bundle failed verification with {len(self.problems)} problem(s):\n{shown}")


class BundleReplacedError(BundleError):
    """The bundle directory was replaced (``overwrite=True``) while this ``Bundle`` was open;
    open it again to read the new one."""


class GarbagePrefixError(BundleError, ValueError):
    """``collect_garbage`` was given a prefix it cannot judge: inside a shared media pool, a
    generation or a bundle's media, where the pointers that may list the objects lie outside it.
    The message names the prefix to give instead."""


class UnsafeStoreError(BundleError):
    """The store ignores ``If-None-Match: *`` or ``If-Match``, so a commit there would not be
    atomic against a second writer (see :mod:`bundles._store.probe`); the message names the
    endpoint, the bucket, what was ignored and the single-writer opt-in."""


class UnsafeStoreWarning(UserWarning):
    """A store ignores preconditions and the single-writer opt-in was given: written anyway."""


# The store client's errors (bundles/_store/client.py raises them): not public names, so not in
# __all__ (bundles.__all__ is this module's __all__).


class ObjectTooLargeError(UnsafeBundleError):
    """An object larger than the cap its reader puts on it (:meth:`Store.get` with ``max_bytes``),
    refused before its body is read."""


class ObjectNotFoundError(BundleNotFoundError):
    """No object at the key (``<url>: not found``); a missing bucket is a
    :class:`BucketNotFoundError` instead, never this."""


class ObjectExistsError(BundleExistsError):
    """A create-only put found an object at the key (:meth:`Store.put_new`)."""


class StoreFailure(Exception):
    """Mixed into the errors of a request the store failed (refused, unreachable, no bucket),
    as opposed to an answer about the object (:class:`ObjectNotFoundError`, :class:`ObjectExistsError`,
    :class:`ObjectTooLargeError`): a caller that takes "absent" or "unreadable" as a value
    catches :class:`BundleError` after ``except StoreFailure: raise``."""


class StoreIOError(BundleIOError, StoreFailure):
    """The store failed the request: after the retries, no credentials, a refused endpoint."""


class StoreAccessDeniedError(StoreIOError):
    """The store refused the request's credentials (403, or 401)."""


class StoreBucketNotFoundError(BucketNotFoundError, StoreFailure):
    """The bucket (or container) of the request does not exist."""


# The directory of the package (this module sits at its top): frames below it are bundles' own.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def stacklevel_outside_bundles() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside this package,
    however many of its frames lie between (the entry module, the store's upload). Here, beside the
    warnings it serves, so that the writer and the store's probe both take it from below them."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
