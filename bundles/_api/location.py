"""Where a bundle lives, decided once: :class:`Location` and its four kinds.

A bundle lives in a local directory, a local packed file (``.rbundle``), a prefix on an object
store, or a packed object on a store (a URL ending in ``.rbundle``). :meth:`Location.of` is the
one place that reads a location's text and picks the kind; everything after it (the public entry
points of :mod:`bundles._api.entry`, the CLI, trainer_hooks) calls a method of the object it got and
never asks which kind it holds. What differs between the kinds, where a caller must adapt, is
said by capabilities, class attributes each kind declares:

``can_hard_link``
    the bundle's media may be hard links to the run's own files (a directory on the same
    filesystem); elsewhere their bytes are copied, packed or uploaded.
``commits_by``
    ``"rename"`` (staged, fsynced, renamed into place: docs/FORMAT.md §6) or
    ``"create-only put"`` (the pointer or the packed object put last, on a store without
    rename: §9).
``needs_probe``
    the store is asked once, before the first commit, whether it honours preconditions
    (:mod:`bundles._store.probe`); a store that does not is refused.
``has_pool``
    bundles written beside each other with ``shared_media`` share a content-addressed media
    pool, which :meth:`Location.collect_garbage` sweeps; a directory has none (its bundles share
    files by hard links, and deleting a bundle deletes only its own links).
``uploads``
    publishing moves the bundle's bytes over the network; a caller on a training loop's hot
    path may publish it in the background (:meth:`Location.stage` then :meth:`Staged.publish`).

Local kinds are :class:`pathlib.Path` subclasses and store kinds :class:`~bundles.StoreURL`
subclasses (a ``str``), so a location compares, prints, hashes and pickles as the path or URL it
names and code written against the paths :func:`bundles.write_bundle` used to return keeps
working. A path derived from a local location (``loc / "x"``, ``loc.parent``) is only a path:
:meth:`Location.of` reads the kind from the text again.

Writing anywhere but a directory needs a local scratch copy first: the bundle is written there by
the one local writer (every check and error of ``write_bundle`` applies), then packed or uploaded,
and the scratch removed whatever happens. That recipe is :meth:`Location.stage` and exists once;
the scratch lies beside the first media root (same filesystem, so media are hard-linked into it)
or beside the destination file, and is named like a staging directory, so that a write after a
crash removes what a killed process left. Errors of the local writer name the destination, never
the scratch.
"""

from __future__ import annotations

import abc
import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

from bundles import _store
from bundles._errors import BundleError, BundleExistsError, BundleIOError, BundleNotFoundError, public_path
from bundles._format.layout import PACK_SUFFIX
from bundles._format.options import Verify
from bundles._local.commit import (
    commit,
    is_staging_name,
    remove_bundle_dir,
    scratch_dir,
    staging_name,
)
from bundles._local.fs import remove_tree
from bundles._local.pack import pack_local, unpack_local
from bundles._local.proof import NotProven, Proof, examine_directory, removable_names
from bundles._local.reader import Bundle, open_local
from bundles._local.writer import resolve_media_roots, write_local
from bundles._urls import STORE_SCHEMES, StoreURL, classify, url_scheme

__all__ = [
    "DirectoryLocation",
    "Location",
    "PackedFileLocation",
    "Staged",
    "StoreLocation",
    "StorePackedLocation",
]

#: Writes a bundle at the path it is given (which must not exist) and returns that path.
WriteHere = Callable[[Path], os.PathLike[str]]


def _packed_name(text: str) -> bool:
    return text.endswith(PACK_SUFFIX) and len(text.rstrip("/").rsplit("/", 1)[-1]) > len(PACK_SUFFIX)


class Location(abc.ABC):
    """A place a bundle is, or will be, written: build one with :meth:`Location.of`.

    Every method answers for its own kind; the class attributes say what differs (see the
    module docstring). ``storage_options`` (store kinds only) configure every request made
    through this location.
    """

    can_hard_link: ClassVar[bool]
    commits_by: ClassVar[str]
    needs_probe: ClassVar[bool]
    has_pool: ClassVar[bool]
    uploads: ClassVar[bool]
    storage_options: Mapping[str, Any] | None

    @staticmethod
    def of(
        where: str | os.PathLike[str] | Location, storage_options: Mapping[str, Any] | None = None
    ) -> Location:
        """The location ``where`` names: a store URL (``s3://``, ``gs://``, ``az://``; ending in
        ``.rbundle`` for a packed object), else a local path (ending in ``.rbundle`` for a packed
        file), made absolute. Any other URL scheme, a store URL whose ``//`` was collapsed, an empty
        key part, and ``storage_options`` for a local path are refused with a
        :class:`~bundles.BundleError` naming the location. Naming needs no store client: the
        missing extra is reported by the first request."""
        if isinstance(where, Location) and storage_options is None:
            return where
        text = os.fspath(where)
        if not isinstance(text, str) or not text:
            raise BundleError(f"{text!r}: not a location: expected a path or an object-store URL")
        if url_scheme(text) in STORE_SCHEMES:
            kind: type[_OnStore] = StorePackedLocation if _packed_name(text) else StoreLocation
            return kind(text, storage_options)
        classify(text)  # refuses another URL scheme, and a store URL whose '//' was collapsed
        if storage_options is not None:
            raise BundleError(f"{text}: storage_options apply to object-store URLs only")
        path = os.path.abspath(text)
        return PackedFileLocation(path) if _packed_name(text) else DirectoryLocation(path)

    @staticmethod
    def of_all(
        *wheres: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> list[Location]:
        """:meth:`of` for several locations of one operation (a pack's input and output) that
        share ``storage_options``: each store URL among them takes them; given with no store URL
        among them, they are refused as :meth:`of` refuses them."""
        found = [Location.of(w) for w in wheres]
        if storage_options is None:
            return found
        if not any(loc.uploads for loc in found):
            raise BundleError(f"{os.fspath(wheres[0])}: storage_options apply to object-store URLs only")
        return [Location.of(loc, storage_options) if loc.uploads else loc for loc in found]

    @abc.abstractmethod
    def __fspath__(self) -> str:
        """The path, or the URL: every location is :class:`os.PathLike`."""

    # -- what every kind does -------------------------------------------------------------------
    @abc.abstractmethod
    def examine(self) -> Proof | NotProven:
        """Prove that a bundle is here (the rule of :mod:`bundles._local.proof`: a manifest that parses
        and validates, a store pointer that names a generation of its own prefix whose manifest
        validates), or say why not. Every question "is this a bundle?" (``has_bundle``,
        ``list_bundles``, ``remove_bundle``, overwriting, ``ls``) is answered here. Cost: one
        bounded read of a directory's manifest; two GETs on a store prefix (pointer, manifest);
        the member index of a packed bundle."""

    def has_bundle(self) -> bool:
        """True when a bundle is proven here (:meth:`examine`; its cost). Shards and media are not
        read: :meth:`open_bundle` with ``verify`` checks them."""
        return isinstance(self.examine(), Proof)

    @abc.abstractmethod
    def open_bundle(self, verify: Verify = Verify.FAST) -> Bundle:
        """The bundle here, read in place and verified to ``verify``."""

    @abc.abstractmethod
    def remove_bundle(self, damaged: bool = False) -> None:
        """Delete the bundle here, and only what it owns, so that no reader finds half of it: the
        one deletion rule (:func:`bundles._local.proof.removable_names`) over what :meth:`examine`
        proved, applied by each kind. ``damaged``: also a bundle whose manifest (or pointer)
        claims the format but does not validate, and then only the names the format writes."""

    @abc.abstractmethod
    def list_bundles(self) -> list[Location]:
        """The bundles right under this location (one level), sorted by name."""

    @abc.abstractmethod
    def child(self, rel: str) -> Location:
        """The location ``rel`` (``/``-separated parts) below this one; ``""`` is this one."""

    @abc.abstractmethod
    def pack_from(self, bundle: Bundle, *, overwrite: bool, progress: bool | None) -> Location:
        """Pack the open ``bundle`` into one file here (atomically)."""

    @abc.abstractmethod
    def unpack_to(self, out_dir: str | os.PathLike[str], *, overwrite: bool, progress: bool | None) -> Bundle:
        """Unpack the packed bundle here into the new local directory ``out_dir``."""

    @abc.abstractmethod
    def _scratch_beside(self, media_roots: list[Path]) -> Path:
        """Where a scratch copy of a bundle written here goes (same filesystem as what it links)."""

    @abc.abstractmethod
    def _publish(
        self, local: Path, *, overwrite: bool, shared_media: bool, progress: bool | None
    ) -> Location:
        """Put the complete local bundle ``local`` in place here."""

    def _refuse_existing(self, overwrite: bool) -> None:
        """Refuse to stage a write over a bundle without ``overwrite``, before any work."""
        if not overwrite and self.has_bundle():
            raise BundleExistsError(f"{self}: destination exists; pass overwrite=True to replace it")

    def _refuse_unproven(self, overwrite: bool) -> None:
        """``overwrite`` replaces a proven bundle or nothing: a user's file or object named like a
        packed bundle, or a damaged one, is refused before anything is written."""
        if not overwrite:
            return
        found = self.examine()
        if isinstance(found, NotProven) and not found.empty:
            what = "a damaged bundle" if found.damaged else "not a bundle"
            raise BundleExistsError(
                f"{self}: destination exists and is {what}; refusing to replace it ({found.why})"
            )

    def collect_garbage(self, *, older_than_s: float, dry_run: bool = False) -> _store.GarbageReport | None:
        """Sweep the media pool and the unpublished generations under this location (see
        :func:`bundles.collect_garbage`); None where there is no pool (``has_pool`` is false)."""
        return None

    def objects(self) -> _store.StorePrefix:
        """The objects right under this location, by name (create-only puts, reads, listing,
        deletes: what a journal of shipments needs). Where ``uploads`` only: a local location
        holds files, which a caller writes itself."""
        raise BundleError(f"{self}: a local location holds files, not store objects")

    # -- writing: the one staged recipe ----------------------------------------------------------
    def stage(
        self, write: WriteHere, *, media_roots: Iterable[str | os.PathLike[str]] = (), overwrite: bool = False
    ) -> Staged:
        """Write a bundle for this location with ``write`` (given the local path to write at),
        and return it staged: :meth:`Staged.publish` puts it in place (nothing left to do for a
        directory, a pack onto a packed file, an upload to a store), which may run on another
        thread. The scratch copy is removed by ``publish`` or :meth:`Staged.discard`, whatever
        happens; an error of ``write`` names this location, not the scratch."""
        self._refuse_existing(overwrite)
        scratch = scratch_dir(self._scratch_beside([Path(p) for p in media_roots]), "write")
        local = scratch / "bundle"
        try:
            write(local)
        except BundleError as e:
            _name_the_location(e, local, self)
            _remove_scratch(scratch)
            raise
        except BaseException:
            _remove_scratch(scratch)
            raise
        return Staged(self, local, scratch, overwrite)

    def write_bundle(
        self,
        samples: Iterable[Any],
        *,
        media_roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        overwrite: bool = False,
        progress: bool | None = None,
        shared_media: bool = False,
        **options: Any,
    ) -> Location:
        """:func:`bundles.write_bundle` here: the same arguments, the committed location back."""
        roots = resolve_media_roots(media_roots, self)
        staged = self.stage(
            lambda where: write_local(
                where, samples, media_roots=roots, overwrite=False, progress=progress, **options
            ),
            media_roots=roots,
            overwrite=overwrite,
        )
        return staged.publish(shared_media=shared_media, progress=progress)


def _name_the_location(error: BaseException, local: Path, location: Location) -> None:
    """Name ``location`` in ``error``, not the scratch copy ``local`` (which is about to go)."""
    if error.args and isinstance(error.args[0], str):
        text = error.args[0].replace(str(local), str(location))
        shown = public_path(str(local))  # how BundleIOError names a path inside a staging directory
        if isinstance(shown, str):
            text = text.replace(shown, str(location))
        error.args = (text, *error.args[1:])


def _remove_scratch(scratch: Path) -> None:
    # A failure here must not hide the write's own outcome: the leftover is named like a staging
    # directory, so the first write into its parent after this process exits removes it.
    with contextlib.suppress(BundleError):
        remove_tree(scratch)


class Staged:
    """A bundle written to local scratch for a :class:`Location`, not yet in place there."""

    def __init__(self, location: Location, local: Path, scratch: Path | None, overwrite: bool) -> None:
        self.location = location
        #: The complete local bundle (readable until :meth:`publish` or :meth:`discard`).
        self.local = local
        self._scratch = scratch
        self._overwrite = overwrite

    def publish(self, *, shared_media: bool = False, progress: bool | None = None) -> Location:
        """Put the bundle in place (``shared_media``: into the store's pool beside it) and remove
        the scratch copy; the location back."""
        try:
            return self.location._publish(
                self.local, overwrite=self._overwrite, shared_media=shared_media, progress=progress
            )
        except BundleError as e:
            _name_the_location(e, self.local, self.location)
            raise
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the scratch copy without publishing (once; later calls do nothing)."""
        if self._scratch is not None:
            _remove_scratch(self._scratch)
            self._scratch = None


# -- local kinds ---------------------------------------------------------------------------------
_PathBase: Any = type(Path())


class _Local(Location, _PathBase):
    """A local path: a :class:`pathlib.Path` that is also a :class:`Location`."""

    can_hard_link: ClassVar[bool] = False
    commits_by: ClassVar[str] = "rename"
    needs_probe: ClassVar[bool] = False
    has_pool: ClassVar[bool] = False
    uploads: ClassVar[bool] = False
    storage_options = None

    # A derived path (``loc / "x"``, ``loc.parent``) is only a path (module docstring).
    if sys.version_info >= (3, 12):

        def with_segments(self, *pathsegments: Any) -> Path:
            return Path(*pathsegments)

    else:

        @classmethod
        def _from_parsed_parts(cls, drv: str, root: str, parts: list[str]) -> Path:
            return _PathBase._from_parsed_parts(drv, root, parts)  # type: ignore[no-any-return,unused-ignore]

    def __fspath__(self) -> str:
        return str(self)

    def open_bundle(self, verify: Verify = Verify.FAST) -> Bundle:
        return open_local(self, verify)

    def child(self, rel: str) -> Location:
        return Location.of(Path(self).joinpath(*rel.split("/")) if rel else Path(self))

    def list_bundles(self) -> list[Location]:
        base = Path(self)
        try:
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise BundleError(f"{base}: cannot list it: {e.strerror}") from e
        found = (Location.of(base / e.name) for e in entries)
        return [loc for loc in found if loc.has_bundle()]

    def pack_from(self, bundle: Bundle, *, overwrite: bool, progress: bool | None) -> Location:
        self._refuse_unproven(overwrite)
        pack_local(bundle, self, overwrite=overwrite, progress=progress)
        return self

    def unpack_to(self, out_dir: str | os.PathLike[str], *, overwrite: bool, progress: bool | None) -> Bundle:
        return unpack_local(self, out_dir, overwrite=overwrite, progress=progress)


class DirectoryLocation(_Local):
    """A bundle directory: written in place by the local writer (staged beside it, renamed)."""

    can_hard_link: ClassVar[bool] = True

    def examine(self) -> Proof | NotProven:
        return examine_directory(self)

    def remove_bundle(self, damaged: bool = False) -> None:
        remove_bundle_dir(self, damaged)

    def write_bundle(
        self,
        samples: Iterable[Any],
        *,
        media_roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        overwrite: bool = False,
        progress: bool | None = None,
        shared_media: bool = False,  # a directory's bundles share files by hard links already
        **options: Any,
    ) -> Location:
        write_local(self, samples, media_roots=media_roots, overwrite=overwrite, progress=progress, **options)
        return self

    def _scratch_beside(self, media_roots: list[Path]) -> Path:
        return Path(self)  # a sibling: the staged bundle is renamed into place

    def _publish(
        self, local: Path, *, overwrite: bool, shared_media: bool, progress: bool | None
    ) -> Location:
        # The writer's own commit (docs/FORMAT.md §5), from a staging sibling named as §5 names
        # it: a crash between the two renames of a replacement is then recovered as any write's
        # is (a bundle left inside the scratch directory would be swept with it).
        dest = Path(self)
        staging = staging_name(dest)
        try:
            os.rename(local, staging)
        except OSError as e:
            raise BundleIOError.wrap(dest, "stage the bundle beside it", e) from e
        try:
            commit(staging, dest, overwrite)
        except BaseException:
            _remove_scratch(staging)
            raise
        return self


class PackedFileLocation(_Local):
    """A packed ``.rbundle`` file: built in scratch beside it, packed onto it atomically."""

    def _regular(self) -> bool:
        try:
            st = os.lstat(self)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            raise BundleError(f"{self}: cannot look at it: {e.strerror}") from e
        return stat.S_ISREG(st.st_mode) and not is_staging_name(self.name)

    def examine(self) -> Proof | NotProven:
        if not self._regular():
            if not os.path.lexists(self):
                return NotProven(str(self), f"{self}: no bundle here (path does not exist)", empty=True)
            return NotProven(str(self), f"{self}: not a packed bundle (not a regular file)")
        return _examine_packed(self)

    def remove_bundle(self, damaged: bool = False) -> None:
        # One file: one unlink is atomic for readers. A packed file that does not index is
        # refused even with ``damaged`` (it is one file of unknown content: remove it by hand).
        removable_names(self.examine(), damaged=False)
        try:
            os.unlink(self)
        except FileNotFoundError:
            raise BundleNotFoundError(
                f"{self}: no bundle here (removed meanwhile by another process)"
            ) from None
        except OSError as e:
            raise BundleError(f"{self}: cannot remove: {e.strerror}") from e

    def _scratch_beside(self, media_roots: list[Path]) -> Path:
        return Path(self)  # a sibling of the file: same filesystem, the pack renames onto it

    def _publish(
        self, local: Path, *, overwrite: bool, shared_media: bool, progress: bool | None
    ) -> Location:
        with open_local(local, Verify.FAST) as b:
            return self.pack_from(b, overwrite=overwrite, progress=progress)


def _examine_packed(location: Location) -> Proof | NotProven:
    """A packed bundle (file or object) is proven by its member index and the manifest in it,
    read and checked by the reader's own rules (nothing else verified)."""
    try:
        with location.open_bundle(Verify.NONE) as b:
            return Proof(str(location), b.manifest)
    except BundleNotFoundError as e:
        return NotProven(str(location), f"{e}", empty=True)
    except BundleError as e:
        reason = str(e) if str(e).startswith(f"{location}: ") else f"{location}: not a packed bundle: {e}"
        return NotProven(str(location), reason)


# -- store kinds ---------------------------------------------------------------------------------
class _OnStore(Location, StoreURL):
    """A location on an object store: a :class:`~bundles.StoreURL` that is also a :class:`Location`."""

    can_hard_link: ClassVar[bool] = False
    commits_by: ClassVar[str] = "create-only put"
    needs_probe: ClassVar[bool] = True
    uploads: ClassVar[bool] = True

    def __new__(cls, text: str, storage_options: Mapping[str, Any] | None = None) -> _OnStore:
        self = cast("_OnStore", super().__new__(cls, text))
        self.storage_options = dict(storage_options) if storage_options is not None else None
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.storage_options))

    def __fspath__(self) -> str:
        return str(self)

    def _client(self, what: str = "bundle") -> str:
        """The URL, once the store client is known to be installed (one line naming the extra)."""
        classify(str(self), what)
        return str(self)

    def child(self, rel: str) -> _OnStore:
        return cast("_OnStore", Location.of(f"{self}/{rel}" if rel else str(self), self.storage_options))

    def objects(self) -> _store.StorePrefix:
        return _store.StorePrefix(self._client(), self.storage_options)

    def list_bundles(self) -> list[Location]:
        url, so = self._client(), self.storage_options
        found = [str(u) for u in _store.list_remote_bundles(url, so).values()]
        return [Location.of(t, so) for t in sorted(found + _store.list_packed_objects(url, so))]

    def open_bundle(self, verify: Verify = Verify.FAST) -> Bundle:
        return _store.open_on_store(self._client(), verify=verify, storage_options=self.storage_options)

    def pack_from(self, bundle: Bundle, *, overwrite: bool, progress: bool | None) -> Location:
        self._refuse_unproven(overwrite)
        _store.pack_on_store(
            bundle, self._client("pack output"), overwrite=overwrite, progress=progress,
            storage_options=self.storage_options,
        )  # fmt: skip
        return self

    def unpack_to(self, out_dir: str | os.PathLike[str], *, overwrite: bool, progress: bool | None) -> Bundle:
        return _store.unpack_on_store(
            self._client("packed bundle"), out_dir, overwrite=overwrite, progress=progress,
            storage_options=self.storage_options,
        )  # fmt: skip

    def _scratch_beside(self, media_roots: list[Path]) -> Path:
        # Beside the first media root: same filesystem, so the local writer hard-links media.
        # Where that parent is not writable (media_roots=$HOME under /home, or "/"), the temp
        # directory serves: media are then copied into the scratch, not linked.
        if media_roots:
            root = Path(os.path.abspath(media_roots[0]))
            if root.parent != root and os.access(root.parent, os.W_OK | os.X_OK):
                return root
        return Path(tempfile.gettempdir()) / "rollout-bundles"

    def _refuse_existing(self, overwrite: bool) -> None:
        self._client()
        self._refuse_inside()
        super()._refuse_existing(overwrite)

    def _refuse_unproven(self, overwrite: bool) -> None:
        self._refuse_inside()
        super()._refuse_unproven(overwrite)

    def _refuse_inside(self) -> None:
        """No bundle is written inside another's generation (:func:`bundles._store.inside_generation`)."""
        inside = _store.inside_generation(self)
        if inside is not None:
            raise BundleExistsError(f"{inside}: refusing to write a bundle there")


class StoreLocation(_OnStore):
    """A bundle prefix on a store: media, one generation, then the pointer (docs/FORMAT.md §9)."""

    has_pool: ClassVar[bool] = True

    def examine(self) -> Proof | NotProven:
        return _store.examine_on_store(self._client(), self.storage_options)

    def remove_bundle(self, damaged: bool = False) -> None:
        _store.remove_on_store(self._client(), self.storage_options, damaged=damaged)

    def collect_garbage(self, *, older_than_s: float, dry_run: bool = False) -> _store.GarbageReport | None:
        return _store.collect_garbage(
            self._client("garbage collection"), older_than_s=older_than_s, dry_run=dry_run,
            storage_options=self.storage_options,
        )  # fmt: skip

    def _publish(
        self, local: Path, *, overwrite: bool, shared_media: bool, progress: bool | None
    ) -> Location:
        _store.upload_bundle(
            local, str(self), overwrite=overwrite, shared_media=shared_media, progress=progress,
            storage_options=self.storage_options,
        )  # fmt: skip
        return self


class StorePackedLocation(_OnStore):
    """A packed ``.rbundle`` object on a store: packed locally, put in one atomic request."""

    has_pool: ClassVar[bool] = False

    def examine(self) -> Proof | NotProven:
        self._client()
        inside = _store.inside_generation(self)
        return NotProven(str(self), inside) if inside is not None else _examine_packed(self)

    def remove_bundle(self, damaged: bool = False) -> None:
        removable_names(self.examine(), damaged=False)  # one object: see PackedFileLocation
        _store.remove_packed_object(self._client(), self.storage_options)

    def _publish(
        self, local: Path, *, overwrite: bool, shared_media: bool, progress: bool | None
    ) -> Location:
        with open_local(local, Verify.FAST) as b:
            return self.pack_from(b, overwrite=overwrite, progress=progress)
