"""``open_bundle`` and :class:`Bundle`: read, verify and rehydrate a bundle.

Nothing read from a bundle is trusted before it is checked: the manifest's size is capped before
it is parsed, every path in it must match the layout (so none can escape the directory), each
shard's compressed bytes must match their digest and decompress to no more than their recorded
size (a zstd bomb stops at the cap), and decoding builds only plain values, numpy arrays and
tensors: nothing from a file is ever executed or unpickled.

Verification levels: ``"none"`` parses the manifest; ``"fast"`` also checks that the directory
holds exactly the listed regular files with their recorded sizes and that shard digests match;
``"full"`` also re-hashes every media file (in a few threads: hashlib releases the GIL).

The reader sees the bundle through a source (:mod:`bundles._local.sources`): a directory, or a packed
file read in place by member offsets. Everything here works the same on both; a packed file's
members are checked by the rules ``unpack_bundle`` applies before anything in them is used.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, overload

from bundles._errors import (
    BundleError,
    BundleFormatError,
    BundleIndexError,
    BundleIOError,
    BundleNotFoundError,
    BundleReplacedError,
    BundleVerificationError,
    MediaMissingError,
    UnsafeBundleError,
)
from bundles._format.layout import MANIFEST_NAME, MEDIA_DIR
from bundles._format.manifest import Manifest, ShardEntry, parse_manifest_bytes, parse_manifest_file
from bundles._format.media import MediaRef
from bundles._format.options import LinkMode, Verify
from bundles._format.shards import Rehashed, ShardData, digest_problem, iter_shard
from bundles._local.archive import PackedMembers, PackedSource
from bundles._local.atomic import atomic_path
from bundles._local.commit import is_staging_name
from bundles._local.fs import check_link_mode, copy_and_hash, ingest, make_read_only
from bundles._local.progress import Progress
from bundles._local.sources import DirSource, RemoteSource, Source
from bundles._local.spill import spill_shard
from bundles._local.stored import MediaRefs, StoredMedia
from bundles._local.verifying import Expected, digest_problems, listing_problems
from bundles._urls import local_path_only

if TYPE_CHECKING:
    from bundles._urls import StoreURL

VERIFY_LEVELS = Verify.values()


def read_at_most(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes of ``f``: a single read may return less (e.g. Linux's 2 GiB per call)."""
    chunks: list[bytes] = []
    left = n
    while left > 0:
        chunk = f.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def load_manifest(source: Source, again: bool = False) -> Manifest:
    """Read and validate the manifest of ``source`` (size capped before it is parsed); ``again``:
    as the location holds it now (``Source.reread_manifest``). A directory's is read from its
    file a window at a time, never whole, and so is a packed file's from its member's range
    (locally or on a store); a store's manifest object arrives as one ``bytes`` (the pointer's
    digest is checked before it is parsed) and is parsed through a window, never as text whole
    (``bundles._format.manifest``). A packed file whose manifest is its first member had it
    parsed while its index was read (:func:`bundles._local.archive.read_tar_index`): that one is
    returned, once, and shares its media table with the index."""
    where = source.where(MANIFEST_NAME)
    if isinstance(source, PackedMembers) and not again:
        parsed = source.members.take_manifest()
        if parsed is not None:
            return parsed
    # reread: the directory at the path now; the packed file opened (one object, read again)
    if isinstance(source, (DirSource, PackedMembers)):
        with source.open_manifest() as f:
            return parse_manifest_file(f, where)
    return parse_manifest_bytes(source.reread_manifest() if again else source.read_manifest(), where)


def parse_manifest(path: Path) -> Manifest:
    """Read and validate ``<path>/manifest.json`` of a bundle directory; raise naming the field."""
    return load_manifest(DirSource(path))


class Bundle:
    """An open bundle: a directory, or a packed file read in place. Create with :func:`open_bundle`.

    A bundle opened from a packed file holds the file open (see :mod:`bundles._local.sources`); use it as
    a context manager or call :meth:`close` to release it early.
    """

    def __init__(self, source: Source, manifest: Manifest) -> None:
        self._source = source
        self.path = source.path
        #: The validated manifest (:class:`Manifest`: the stored JSON object, fields typed).
        self.manifest = manifest
        # Stored name -> MediaRef, each made when asked for (no object per file: issue 39, item 6).
        self._media = StoredMedia(manifest.media, source)

    def __repr__(self) -> str:
        return (
            f"Bundle({str(self.path)!r}, kind={self.kind!r}, samples={len(self)}, media={len(self._media)})"
        )

    def __len__(self) -> int:
        return self.manifest.sample_count

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        return self.samples()

    @overload
    def __getitem__(self, index: int) -> dict[Any, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[Any, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[Any, Any] | list[dict[Any, Any]]:
        """Sample ``index`` (negative counts from the end), reading only the shard that holds it;
        a slice gives a list, reading each shard it touches once."""
        if isinstance(index, slice):
            return list(self.samples(indices=range(len(self))[index]))
        return next(self.samples(indices=[index]))

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the packed file a bundle opened from one holds (nothing for a directory)."""
        self._source.close()

    @property
    def packed(self) -> bool:
        """True when the bundle is read in place from a packed file."""
        return self._source.packed

    @property
    def location(self) -> str:
        """What kind of location the bundle is read from, in words: ``"directory"``, ``"packed
        file"``, ``"object store"`` or ``"packed file on an object store"``."""
        return self._source.description

    @property
    def stored_bytes(self) -> int:
        """What the bundle occupies where it lives: a packed bundle's file (or object), else the
        bytes of its shards and stored media as the manifest lists them."""
        size = self._source.stored_size()
        if size is not None:
            return size
        return sum(s.size for s in self.manifest.shards) + self.media_bytes

    @property
    def media_dir(self) -> Path | None:
        """The local directory holding the stored media as plain files, for a page to link to;
        None where they are members of a packed file or objects on a store."""
        return self._source.media_dir()

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest.meta

    @property
    def media(self) -> MediaRefs:
        """Every stored media file, with ``path`` set inside the bundle: a read-only sequence in
        the manifest's order whose ``MediaRef``s are made as they are read (see
        :mod:`bundles._local.stored`).

        For a packed bundle ``path`` is ``<packed file>/media/<name>``: it names the member and
        cannot be opened as a file; read it with :meth:`open_media`, or :meth:`rehydrate` the
        bundle to get files.
        """
        return MediaRefs(self._media)

    @property
    def media_bytes(self) -> int:
        return self.manifest.media.total_size()

    @property
    def media_references(self) -> int:
        """How many references the samples hold (each stored file may serve many)."""
        recorded = self.manifest.media_references
        return len(self._media) if recorded is None else recorded

    def _open_image(self, name: str) -> BinaryIO:
        """A stored file for an image whose pixels are decoded later, perhaps after
        :meth:`close` (``Source.open_image``: a packed member by range, a store object whole)."""
        source = self._source
        try:
            return source.open_image(f"{MEDIA_DIR}/{name}")
        except FileNotFoundError:
            raise MediaMissingError(
                f"{source.where(MEDIA_DIR + '/' + name)}: listed in the manifest but missing"
            ) from None

    def open_media(self, ref: MediaRef | str) -> BinaryIO:
        """Open one stored media file for reading, in a directory or a packed bundle alike.

        ``ref`` is a ``MediaRef`` or a path string as :meth:`samples` returns them, or a stored
        file name ``<hex><suffix>``. The bytes are not verified here (:meth:`verify` does that).
        """
        name = ref.filename if isinstance(ref, MediaRef) else os.path.basename(os.fspath(ref))
        if name not in self._media:
            raise MediaMissingError(f"{self.path}: {MEDIA_DIR}/{name}: not a media file of this bundle")
        try:
            f, _ = self._source.open(f"{MEDIA_DIR}/{name}")
        except FileNotFoundError:
            raise MediaMissingError(
                f"{self._source.where(MEDIA_DIR + '/' + name)}: listed in the manifest but missing"
            ) from None
        return f

    # -- verification ----------------------------------------------------------------------------
    def problems(self, full: bool = True, progress: bool | None = False) -> list[str]:
        """Every problem found, as messages naming the file and field; empty when sound."""
        expected = Expected(self.manifest.shards, self.manifest.media)
        problems, shown = listing_problems(self._source, str(self.path), expected)

        # Only files that passed the listing checks are hashed: one problem per file. Generated
        # as the hashing goes, never listed whole (see bundles._local.verifying).
        def jobs() -> Iterator[tuple[str, str, int]]:
            return expected.jobs(shown, full)

        label = f"verifying {self.path.name}"
        return problems + digest_problems(self._source, jobs, label, progress)

    def verify(self, full: bool | str = True, progress: bool | None = None) -> None:
        """Raise :class:`BundleVerificationError` listing every bad file; return None when sound.

        ``full`` is a bool or a level, ``"fast"`` or ``"full"``. Raises
        :class:`BundleReplacedError` instead when the directory was swapped for another bundle
        since it was opened.
        """
        if isinstance(full, str):
            level = Verify.parse(full)
            if level not in (Verify.FAST, Verify.FULL):
                raise BundleError(f"{self.path}: verify: expected 'fast' or 'full', found {full!r}")
            full = level is Verify.FULL
        problems = self.problems(full=full, progress=progress)
        if problems:
            self._check_not_replaced()
            raise BundleVerificationError(self.path, problems)

    def _check_not_replaced(self) -> None:
        """Tell a bundle swapped in by ``overwrite=True`` from a damaged one.

        Inode numbers are reused at once and directory times are coarse, so the test is the
        manifest itself: a replaced bundle with an identical manifest has identical files. A
        packed bundle is read from the file it opened, whatever is renamed over its path since.
        """
        if self._source.packed:
            return
        try:
            current = load_manifest(self._source, again=True)
        except BundleError:
            current = None
        if current != self.manifest:
            raise BundleReplacedError(
                f"{self.path}: the bundle was replaced or removed while open (overwrite=True by another "
                "writer); open it again"
            )

    # -- reading ---------------------------------------------------------------------------------
    def _read_shard(self, entry: ShardEntry) -> tuple[BinaryIO | None, ShardData]:
        try:
            return self._read_shard_unchecked(entry)
        except (BundleVerificationError, UnsafeBundleError, BundleFormatError):
            self._check_not_replaced()
            raise

    def _read_shard_unchecked(self, entry: ShardEntry) -> tuple[BinaryIO | None, ShardData]:
        """The shard checked against its digest: its open file and a function reading it again
        for the decoder, never held in memory (a store's first copied into a temporary file:
        :func:`bundles._local.spill.spill_shard`). See :mod:`bundles._format.shards`."""
        path = self._source.where(entry.path)
        try:
            f, size = self._source.open(entry.path)
        except FileNotFoundError:
            raise BundleVerificationError(
                self.path, [f"{path}: listed in the manifest but missing"]
            ) from None
        try:
            if size != entry.size:
                raise BundleVerificationError(
                    self.path, [f"{path}: size: expected {entry.size} bytes, found {size}"]
                )
            if isinstance(self._source, RemoteSource):
                f = spill_shard(f, entry.size, path)
            problem = digest_problem(f, entry, path)
            if problem:
                raise BundleVerificationError(self.path, [problem])
        except BaseException:
            f.close()
            raise

        def changed(message: str) -> BundleVerificationError:
            return BundleVerificationError(self.path, [message])

        return f, lambda: Rehashed(f, entry, path, changed)

    def samples(self, sample_cls: Any = None, *, indices: Iterable[int] | None = None) -> Iterator[Any]:
        """Yield every sample, with references resolved to files inside the bundle.

        Samples are dicts, or, with ``sample_cls`` (any class with a ``from_dict(dict)``
        constructor, e.g. a trainer's ``Sample``), ``sample_cls.from_dict(row)``; ``None`` or
        ``dict`` keeps the dicts. An error raised by ``from_dict`` becomes a
        :class:`BundleFormatError` naming the sample.

        With ``indices``, yield those samples in that order, reading only the shards that hold
        them (each once when the indices ascend). An index out of range raises
        :class:`BundleIndexError` before anything is read. A local shard is verified as it
        streams: its samples reach the caller before its end, where a shard changed while read
        raises :class:`BundleVerificationError` (docs/DATASET.md §1).
        """
        if indices is None:
            return _built(self._samples(self._media), sample_cls, self.path)
        wanted = list(indices)
        return _built(self._samples_at(wanted), sample_cls, self.path, wanted)

    def _samples_at(self, indices: list[int]) -> Iterator[dict[Any, Any]]:
        n = len(self)
        wanted = []
        for i in indices:
            k = operator.index(i)
            if not -n <= k < n:
                raise BundleIndexError(f"{self.path}: sample index {i} is out of range: the bundle holds {n}")
            wanted.append(k % n)
        starts = list(itertools.accumulate((e.samples for e in self.manifest.shards), initial=0))
        # Runs of wanted indices in one shard: each run streams its shard once and keeps only
        # the samples it wants (so bundle[i] holds one sample, not its shard).
        for k, run in itertools.groupby(wanted, key=lambda i: bisect.bisect_right(starts, i) - 1):
            positions = list(run)
            keep = set(positions)
            found: dict[int, dict[Any, Any]] = {}
            entry = self.manifest.shards[k]
            for i, sample in enumerate(self._samples(self._media, [entry], starts[k]), start=starts[k]):
                if i in keep:
                    found[i] = sample
                    if len(found) == len(keep):
                        break
            for i in positions:
                yield found[i]

    def _samples(
        self, media: Mapping[str, MediaRef], shards: list[ShardEntry] | None = None, first_index: int = 0
    ) -> Iterator[dict[Any, Any]]:
        """The samples of ``shards`` (default: all), streamed one at a time from each shard after
        its digest is checked (see :mod:`bundles._format.shards`): memory holds a chunk of the shard
        (a store's whole compressed shard) and one sample, whatever the bundle's size."""
        index = first_index
        # Images read in place open their stored file when their pixels are needed: a packed
        # bundle's by member range (the paths of its own media name members, not files; each
        # image holds a small file object, never a copy of the member, so FORMAT.md §8's bound
        # holds however many times a sample references one image), a remote bundle's by a
        # fetch (its paths are URLs); a directory's through its source too, which opens no
        # component through a symlink (``media -> /elsewhere`` is refused, not read). Rehydrated
        # media are files again.
        open_media = self._open_image if media is self._media else None
        for entry in self.manifest.shards if shards is None else shards:
            f, data = self._read_shard(entry)
            try:
                for sample in iter_shard(data, entry, f"{self.path}/{entry.path}", media, index, open_media):
                    yield sample
                    index += 1
            except BundleFormatError:
                if f is not None:  # a defect in the bytes checked, or a file changed since?
                    problem = digest_problem(f, entry, self._source.where(entry.path))
                    if problem:
                        message = f"{problem} (the file changed while it was read)"
                        raise BundleVerificationError(self.path, [message]) from None
                raise
            finally:
                if f is not None:
                    f.close()

    def to_arrow(
        self, columns: Sequence[str] | None = None, batch_rows: int = 1024, media: bool = False
    ) -> Iterator[Any]:
        """Yield the samples as ``pyarrow.RecordBatch``es (needs the ``rollout-bundles[data]``
        extra), shard by shard: memory holds one shard and one batch of ``batch_rows`` samples.
        ``columns`` picks columns of the schema in docs/DATASET.md; ``media=True`` adds ``images``,
        each screenshot's bytes read in place and checked against its digest. A local shard is
        verified as it streams: rows of a shard reach the caller before its end, where a shard
        changed while read raises :class:`BundleVerificationError`; ``export`` publishes a part
        only after the whole bundle passed. See :mod:`bundles._dataset.arrow`."""
        from bundles._dataset.arrow import to_arrow

        return to_arrow(self, columns, batch_rows, media)

    def rehydrate(
        self,
        media_dir: str | os.PathLike[str],
        link: LinkMode | str = "auto",
        progress: bool | None = None,
        sample_cls: Any = None,
    ) -> list[Any]:
        """Place every media file into ``media_dir`` (content-addressed, ``<hex><suffix>``) and
        return the samples with their references pointing there (built with ``sample_cls`` as
        in :meth:`samples`).

        Files already present with the right size are kept (content-addressed names make them
        the same bytes); others are written to a temporary name and renamed, so a concurrent
        reader never sees a partial file.
        """
        try:
            return list(_built(iter(self._rehydrate(media_dir, link, progress)), sample_cls, self.path))
        except OSError as e:
            if isinstance(e, BundleError):
                raise
            raise BundleIOError.wrap(self.path, f"rehydrate into {media_dir}", e) from e

    def _rehydrate(
        self, media_dir: str | os.PathLike[str], link: LinkMode | str, progress: bool | None
    ) -> list[dict[Any, Any]]:
        link = check_link_mode(link)
        local_path_only(media_dir, "rehydrate media_dir")
        if self._source.packed and link not in (LinkMode.AUTO, LinkMode.COPY):
            raise BundleError(
                f"{self.path}: link='{link}': the members of a packed bundle can only be copied; use link='auto' or 'copy'"
            )
        target = Path(os.path.abspath(media_dir))
        target.mkdir(parents=True, exist_ok=True)
        if isinstance(self._source, RemoteSource):  # a store: downloaded concurrently
            return list(self._samples(self._source.rehydrate(self._media, target, progress)))
        target_dev = os.stat(target).st_dev
        if not self._source.packed and os.path.islink(os.path.join(self.path, MEDIA_DIR)):
            # Linked (not copied) media go by path, not through the member open: a ``media/``
            # that links elsewhere would place files from outside the bundle, unhashed.
            raise UnsafeBundleError(f"{self.path}/{MEDIA_DIR}: expected a directory, found a symlink")
        placed: dict[str, MediaRef] = {}
        with Progress(
            f"rehydrating {self.path.name}", total=len(self._media), unit="files", enabled=progress
        ) as bar:
            for name, ref in self._media.items():
                dst = target / name
                try:
                    if os.stat(dst).st_size == ref.size:
                        placed[name] = ref.with_path(str(dst))
                        bar.advance()
                        continue
                except FileNotFoundError:
                    pass
                # The one atomic write: a temporary file beside ``dst``, renamed over it, removed
                # on failure. No sweep: the run directory holds thousands of files and is removed
                # as a whole when the run ends, leftovers included.
                with atomic_path(dst, sweep=False) as tmp:
                    if self._source.packed:
                        method = "copy"
                    else:
                        src_st = os.stat(str(ref.path))
                        method = ingest(str(ref.path), str(tmp), link, src_st.st_dev, target_dev)
                    if method == "copy":
                        # Copied bytes are hashed on the way: a damaged member is never placed.
                        with self.open_media(ref) as fin:
                            hexdigest, _ = copy_and_hash(fin, str(tmp))
                        if "sha256:" + hexdigest != ref.digest:
                            raise BundleVerificationError(
                                self.path,
                                [f"{ref.path}: digest: expected {ref.digest}, found sha256:{hexdigest}"],
                            )
                        make_read_only(str(tmp))
                    else:
                        make_read_only(str(tmp), src_st.st_mode)
                placed[name] = ref.with_path(str(dst))
                bar.advance()
        return list(self._samples(placed))


def _built(
    rows: Iterator[dict[Any, Any]], sample_cls: Any, path: Path | StoreURL, indices: list[int] | None = None
) -> Iterator[Any]:
    """``rows``, or ``sample_cls.from_dict(row)`` of each; a ``from_dict`` error names the sample
    (its index in the bundle: ``indices[i]`` when the rows are those samples)."""
    if sample_cls is None or sample_cls is dict:
        return rows
    from_dict = getattr(sample_cls, "from_dict", None)
    if not callable(from_dict):
        raise TypeError(f"sample_cls: expected a class with from_dict(dict), found {sample_cls!r}")
    name = getattr(sample_cls, "__qualname__", repr(sample_cls))

    def build() -> Iterator[Any]:
        for i, row in enumerate(rows):
            try:
                sample = from_dict(row)
            except Exception as e:
                where = i if indices is None else indices[i]
                raise BundleFormatError(
                    f"{path}: samples[{where}]: {name}.from_dict: {type(e).__name__}: {e}"
                ) from e
            yield sample

    return build()


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory at ``path`` now (device and inode), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def open_local(path: str | os.PathLike[str], level: Verify) -> Bundle:
    """:func:`bundles.open_bundle` for a local path: a bundle directory, or a packed file read in
    place (its members checked by the unpack rules before anything in them is used)."""
    p = Path(os.path.abspath(path))
    if is_staging_name(p.name):
        raise BundleNotFoundError(f"{p}: is the staging directory of an unfinished write, not a bundle")
    if not p.exists():
        raise BundleNotFoundError(f"{p}: no bundle here (path does not exist)")
    resolved = p.resolve()
    if not p.is_dir():
        source = PackedSource(resolved)
        try:
            bundle = Bundle(source, load_manifest(source))
            if level is not Verify.NONE:
                bundle.verify(full=level is Verify.FULL, progress=False)
        except BaseException:
            source.close()
            raise
        return bundle
    attempts = 10
    for attempt in range(attempts):
        before = _identity(resolved)
        try:
            manifest = parse_manifest(resolved)
        except BundleNotFoundError:
            # An overwrite swaps whole directories and then empties the one swapped out: a
            # reader that opened the directory just before the swap finds its manifest gone.
            # Another directory at the path now is that swap, not a missing bundle: look again.
            if attempt == attempts - 1 or _identity(resolved) in (before, None):
                raise
            continue
        bundle = Bundle(DirSource(resolved), manifest)
        if level is Verify.NONE:
            return bundle
        try:
            bundle.verify(full=level is Verify.FULL, progress=False)
        except BundleReplacedError:
            if attempt == attempts - 1:
                raise
            continue  # an overwrite swapped the directory between reading the manifest and checking
        return bundle
    raise AssertionError("unreachable")
