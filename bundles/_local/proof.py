"""Whether a location holds a bundle: proven from what the format writes, never guessed.

The rule (docs/FORMAT.md §5a). A location holds a bundle only when

* a directory: it is a directory (not a symlink, not a staging or retired name) whose
  ``manifest.json`` is a regular file of at most :data:`~bundles._format.limits.MAX_MANIFEST_BYTES` that
  parses *and validates* (:func:`bundles._format.manifest.parse_manifest_bytes`: ``format``,
  ``format_version``, ``kind``, the shards and media named as the format names them);
* a packed file or packed object: its member index and the manifest inside it pass the same
  checks (the reader's own, :func:`bundles._local.reader.open_local` / the store's packed source);
* a store prefix: its ``bundle.json`` is a pointer that parses (at most
  :data:`~bundles._format.limits.MAX_POINTER_BYTES`) and names a generation *of its own prefix* whose
  manifest has the size and digest the pointer records and validates; or, with no pointer, a
  ``manifest.json`` right under it that validates (a bundle copied verbatim). A prefix named like
  a generation (``g<time>-<hex>``, the only names a valid pointer can give) is part of the
  bundle above it and never a bundle of its own, whatever it holds.

Anything else is no bundle: a web app's ``manifest.json``, a user's ``bundle.json``, an empty
directory. A location whose manifest (or pointer) *claims* the format (its bytes hold
``"format": "rollout-bundle"`` or ``"format": "rollout-bundle-pointer"``) but does not validate is
*damaged*: still no bundle (nothing lists, serves, replaces or removes it), but
``remove_bundle(..., damaged=True)`` / ``rollout-bundle rm --damaged`` may remove the names the
format itself produces there, and nothing else.

Here are the rule and its results (:class:`Proof`, :class:`NotProven`) and the readers for a
directory and a manifest's bytes; the store reader is :func:`bundles._store.pointer.examine_prefix`
and the packed readers are in :mod:`bundles._api.location`. Every caller asks through
:meth:`bundles._api.location.Location.examine` (``has_bundle``, ``list_bundles``, ``is_bundle``,
``rm``, ``ls``, ``cp --force`` and ``overwrite=True``).

Cost: one bounded read of the manifest in a directory; one GET of the pointer and one of the
manifest on a store (two of them small in practice); the member index of a packed bundle.
Trade-off: a proof reads the whole manifest where a stat used to do, because a manifest's
presence proved nothing; the manifest is bounded and small next to the bundle it describes.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bundles._errors import BundleError, BundleFormatError, BundleNotFoundError
from bundles._format.layout import MANIFEST_NAME, MEDIA_DIR, STAGING_RE
from bundles._format.limits import MAX_MANIFEST_BYTES
from bundles._format.manifest import Manifest, parse_manifest_bytes
from bundles._local.sources import layout_name_ok

__all__ = [
    "DAMAGED_HINT",
    "NotProven",
    "Proof",
    "claims_format",
    "examine_directory",
    "examine_directory_fd",
    "judge_manifest",
    "removable_names",
]

# What a manifest or pointer of the format carries, however else it is damaged (truncated, a field
# of the wrong type): the mark that makes it "damaged" rather than someone else's file.
_CLAIM_RE = re.compile(rb'"format"\s*:\s*"rollout-bundle(?:-pointer)?"')
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass(frozen=True)
class Proof:
    """A bundle, proven: the validated manifest, and what else the proof read. ``generation``,
    ``shared_media`` and ``etag`` come from a store pointer (``generation`` None: a directory, a
    packed bundle or a plain copy). A remover that must know the directory it proved is the one
    it acts on holds that directory open (:func:`examine_directory_fd`)."""

    where: str
    manifest: Manifest
    generation: str | None = None
    shared_media: bool = False
    etag: str | None = None

    def members(self) -> list[str]:
        """The bundle-relative names the manifest lists: its shards, then ``media/<file>``."""
        return [e.path for e in self.manifest.shards] + [
            f"{MEDIA_DIR}/{m.filename}" for m in self.manifest.media
        ]


@dataclass(frozen=True)
class NotProven:
    """No bundle here, and why (one line naming the file and what failed).

    ``damaged``: a manifest or pointer that claims the format does not validate (only an explicit
    ``damaged=True`` removal touches it). ``empty``: nothing of anyone's is here (no path, or an
    empty directory, or no object under the prefix's pointer or manifest name): a new bundle may
    be written here without replacing anything.
    """

    where: str
    reason: str
    damaged: bool = False
    empty: bool = False

    @property
    def why(self) -> str:
        """The reason without the location it starts with (for a message that names it first)."""
        head = f"{self.where}: "
        return self.reason[len(head) :] if self.reason.startswith(head) else self.reason


def claims_format(raw: bytes) -> bool:
    """True when ``raw`` (a manifest's or pointer's bytes) carries the format's name as its
    ``format``: a file of ours, however damaged, not someone else's ``manifest.json``."""
    return _CLAIM_RE.search(raw) is not None


def judge_manifest(raw: bytes, where: str) -> Manifest | NotProven:
    """The validated manifest ``raw`` (read from ``where``, named in the reason), or why not."""
    try:
        return parse_manifest_bytes(raw, where)
    except BundleFormatError as e:
        if claims_format(raw):
            return NotProven(where, f"{e}", damaged=True)
        return NotProven(where, f"{where}: not a rollout-bundle manifest ({_first_line(e)})")


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.split(": ", 1)[1] if ": " in text else text


#: What ``remove_bundle(..., damaged=True)`` says it removes, in refusals that suggest it.
DAMAGED_HINT = (
    "`rollout-bundle rm --damaged` (remove_bundle(..., damaged=True)) removes only the names the format "
    f"writes ({MANIFEST_NAME}, samples/NNNNNN.msgpack.zst, media/<64 hex><suffix>)"
)


def removable_names(found: Proof | NotProven, damaged: bool) -> Callable[[str], bool]:
    """Which bundle-relative names a removal of ``found`` may delete: the members a proven
    manifest lists; with ``damaged``, of a damaged bundle, the names the format produces. Raise
    for anything else (nothing is removed): no bundle, or a damaged one without ``damaged``."""
    if isinstance(found, Proof):
        return set(found.members()).__contains__
    if found.damaged and damaged:
        return layout_name_ok
    if found.damaged:
        raise BundleFormatError(f"{found.reason}: a damaged bundle, not removed; {DAMAGED_HINT}")
    if found.empty:
        raise BundleNotFoundError(found.reason)
    raise BundleNotFoundError(f"{found.reason}; refusing to remove it")


def examine_directory(path: str | os.PathLike[str]) -> Proof | NotProven:
    """Prove the directory ``path`` holds a bundle (see the module docstring), or say why not.
    Never follows a symlink; reads at most :data:`MAX_MANIFEST_BYTES` + 1 bytes."""
    p = Path(os.path.abspath(path))
    if STAGING_RE.fullmatch(p.name):
        return NotProven(str(p), f"{p}: a staging or retired directory of a writer, not a bundle")
    try:
        fd = os.open(p, _DIR_FLAGS)
    except OSError as e:
        if os.path.islink(p):
            return NotProven(str(p), f"{p}: a symlink, not a bundle directory")
        if isinstance(e, FileNotFoundError) and not os.path.lexists(p):
            return NotProven(str(p), f"{p}: no bundle here (path does not exist)", empty=True)
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            return NotProven(str(p), f"{p}: not a directory")
        raise BundleError(f"{p}: cannot look at it: {e.strerror}") from e
    try:
        return examine_directory_fd(fd, p)
    finally:
        os.close(fd)


def examine_directory_fd(fd: int, p: Path) -> Proof | NotProven:
    """:func:`examine_directory` of the directory open as ``fd`` (named ``p`` in messages): the
    manifest is read through ``fd``, so the proof holds for that directory whatever its name
    becomes meanwhile."""
    where = f"{p}/{MANIFEST_NAME}"
    try:
        mfd = os.open(MANIFEST_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        with os.scandir(fd) as entries:  # one entry decides: never the whole listing of a big directory
            empty = next(entries, None) is None
        return NotProven(str(p), f"{p}: not a bundle ({MANIFEST_NAME} is missing)", empty=empty)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return NotProven(str(p), f"{where}: not a regular file: not a bundle")
        raise BundleError(f"{where}: cannot read it: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(mfd).st_mode):  # before fdopen, which raises for a directory
        os.close(mfd)
        return NotProven(str(p), f"{where}: not a regular file: not a bundle")
    with os.fdopen(mfd, "rb") as f:
        try:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as e:
            raise BundleError(f"{where}: cannot read it: {e.strerror}") from e
    if len(raw) > MAX_MANIFEST_BYTES:
        reason = f"{where}: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap"
        return NotProven(str(p), reason, damaged=claims_format(raw[:65536]))
    judged = judge_manifest(raw, where)
    if isinstance(judged, NotProven):
        return NotProven(str(p), judged.reason, damaged=judged.damaged)
    return Proof(str(p), judged)
