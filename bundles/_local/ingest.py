"""Media into a bundle being written: :class:`MediaIngester` places each file a sample references
into ``<staging>/media`` (by hardlink, reflink or copy: :mod:`bundles._local.fs`), once per source
path and once per digest, and answers the encoder's questions about references (a string that
names a file in a media root, a :class:`~bundles.MediaRef`, a PIL image). The cost model (what is
hashed, what is trusted) is the writer's: :mod:`bundles._local.writer`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bundles._errors import (
    BundleError,
    BundleIOError,
    MediaMissingError,
    OutsidePathError,
    OutsidePathWarning,
    UnsupportedValueError,
    stacklevel_outside_bundles,
)
from bundles._format.images import png_bytes
from bundles._format.layout import (
    DIGEST_PREFIX,
    MEDIA_DIR,
)
from bundles._format.media import MediaRef, digest_from_name, media_suffix, sha256_file, trusted_ref
from bundles._format.options import OUTSIDE_PATHS, OutsidePolicy
from bundles._local.faults import fault_point
from bundles._local.fs import (
    Durability,
    copy_and_hash,
    ingest,
    make_read_only,
)


def _exists(path: str, follow: bool = True) -> bool:
    """Whether ``path`` exists: False only when it provably does not (``ENOENT``/``ENOTDIR``).
    Any other error (``EACCES`` on a directory on the way) raises: ``os.path.exists`` would call
    an unreadable file missing."""
    try:
        os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


class MediaIngester:
    """Places referenced files into ``<staging>/media`` and answers the encoder's reference questions."""

    def __init__(
        self,
        dest: Path,
        staging: Path,
        media_roots: Sequence[str],
        link: str,
        outside_paths: OutsidePolicy = "warn",
        keep_missing: bool = False,
    ):
        self.dest = dest
        self.keep_missing = keep_missing
        self.outside_paths = outside_paths
        self.outside_files: dict[str, bool] = {}  # absolute string outside the roots -> names a file
        self.outside_count = 0  # references to such files, for the one warning
        self.outside_examples: list[str] = []
        self.media_dir = str(staging / MEDIA_DIR)  # a str: pathlib costs more than the link itself
        self.link = link
        roots: list[str] = []
        for r in media_roots:
            for form in (os.path.abspath(r), os.path.realpath(r)):
                prefix = form.rstrip(os.sep) + os.sep
                if prefix not in roots:
                    roots.append(prefix)
        self.root_prefixes = tuple(roots)
        # The strings the encoder offers to resolve_string: those under a root, and, unless outside
        # paths are kept silently, every absolute one (so that one outside the roots can be told).
        self.string_prefixes = (
            self.root_prefixes if outside_paths == "keep" else (*self.root_prefixes, os.sep)
        )
        self.stored: dict[str, MediaRef] = {}  # filename -> ref
        self.by_source: dict[str, MediaRef] = {}  # normalized source path -> ref
        self.by_value: dict[str, MediaRef] = {}  # reference string as written in samples -> ref
        self.references = 0
        self.images: dict[int, tuple[Any, MediaRef]] = {}  # id(PIL image) -> (image, ref)
        self.durability = Durability()
        self.media_dev = os.stat(self.media_dir).st_dev
        self._tmp_counter = 0

    # -- encoder callbacks -------------------------------------------------------------------
    def resolve_string(self, value: str, where: str) -> MediaRef | None:
        if not self.root_prefixes or not value.startswith(self.root_prefixes):
            if self.outside_paths != "keep" and value.startswith(os.sep):
                self._outside(value, where)
            return None
        known = self.by_value.get(value)
        if known is not None:  # the same screenshot path in many samples: resolved once
            self.references += 1
            return known
        norm = os.path.normpath(value)
        if not (norm + os.sep).startswith(self.root_prefixes) or norm + os.sep in self.root_prefixes:
            if self.outside_paths != "keep":
                self._outside(value, where)
            return None  # e.g. "<root>/../elsewhere": not inside a media root
        ref = self.by_source.get(norm)
        if ref is None:
            if self.keep_missing and not _exists(norm, follow=False):
                return None  # missing_media="keep": the string stays a plain string
            ref = self._ingest(norm, None, where)
            self.by_source[norm] = ref
        self.by_value[value] = ref
        self.references += 1
        return ref

    def _outside(self, value: str, where: str) -> None:
        """An absolute path string outside every media root: kept as a string, which dangles
        once its file goes. Warn or refuse (by ``outside_paths``) when it names a file."""
        is_file = self.outside_files.get(value)
        if is_file is None:
            is_file = self.outside_files[value] = (
                len(value) < 4096 and "\0" not in value and os.path.isfile(value)
            )
        if not is_file:
            return
        action = self.outside_paths(value) if callable(self.outside_paths) else self.outside_paths
        if action not in OUTSIDE_PATHS:
            raise BundleError(
                f"{self.dest}: {where}: outside_paths({value!r}) returned {action!r}; "
                f"expected one of {', '.join(OUTSIDE_PATHS)}"
            )
        if action == "error":
            raise OutsidePathError(
                f"{self.dest}: {where}: {value} names a file outside the media roots "
                f"{[p.rstrip(os.sep) for p in self.root_prefixes]}; the bundle would keep only the path, which "
                "dangles once the file is gone. Pass it as a MediaRef or "
                "its directory in media_roots to store it, or outside_paths='keep' to keep the path"
            )
        if action == "warn":
            self.outside_count += 1
            if len(self.outside_examples) < 3:
                self.outside_examples.append(f"{where} = {value!r}")

    def warn_outside(self) -> None:
        if not self.outside_count:
            return
        files = sum(self.outside_files.values())
        warnings.warn(
            f"{self.dest}: {self.outside_count} absolute path string(s) to {files} existing file(s) outside the "
            f"media roots were kept as plain strings and will dangle once those files are gone: "
            f"{'; '.join(self.outside_examples)}{' ...' if self.outside_count > len(self.outside_examples) else ''}. "
            "Add their directory to media_roots (or pass MediaRefs) to store them, or outside_paths='keep' to "
            "silence this",
            OutsidePathWarning,
            stacklevel=stacklevel_outside_bundles(),
        )

    def resolve_ref(self, ref: MediaRef, where: str) -> MediaRef:
        source = ref.path
        if source is None:
            source = self._find_in_roots(ref, where)
        norm = os.path.normpath(os.path.abspath(source))
        known = self.by_source.get(norm)
        if known is not None:
            if known.digest != ref.digest or known.size != ref.size:
                raise MediaMissingError(
                    f"{self.dest}: {where}: MediaRef for {source} says {ref.digest} ({ref.size} bytes), but the "
                    f"file is {known.digest} ({known.size} bytes)"
                )
        else:
            known = self._ingest(norm, ref, where)
            self.by_source[norm] = known
        self.references += 1
        return MediaRef(ref.digest, ref.size, ref.suffix)

    def store_image(self, image: Any, where: str) -> MediaRef:
        """Store a PIL image as a PNG media file (lossless) and return its reference."""
        key = id(image)
        cached = self.images.get(key)
        if cached is not None and cached[0] is image:
            self.references += 1
            return cached[1]
        try:
            data = png_bytes(image, where)
        except ValueError as e:
            raise UnsupportedValueError(f"{self.dest}: {e}") from None
        ref = MediaRef(DIGEST_PREFIX + hashlib.sha256(data).hexdigest(), len(data), ".png")
        if ref.filename not in self.stored:
            self._tmp_counter += 1
            tmp = os.path.join(self.media_dir, f".ingest-{self._tmp_counter}")
            with open(tmp, "xb") as f:
                f.write(data)
            target = os.path.join(self.media_dir, ref.filename)
            os.rename(tmp, target)
            self._stored_file(ref, target, None)
        # The image is kept alive with its entry, so its id cannot be reused during this write.
        self.images[key] = (image, ref)
        self.references += 1
        return ref

    def _find_in_roots(self, ref: MediaRef, where: str) -> str:
        denied: OSError | None = None
        for prefix in self.root_prefixes:
            candidate = prefix + ref.filename
            try:
                if _exists(candidate):
                    return candidate
            except OSError as e:
                denied = denied or e  # another root may still hold it
        if denied is not None:
            # Not "missing": a root could not be searched (e.g. permission denied).
            raise BundleIOError.wrap(
                f"{self.dest}: {where}", f"look for {ref.filename} in the media roots", denied
            )
        raise MediaMissingError(
            f"{self.dest}: {where}: MediaRef {ref.digest} has no path and no file {ref.filename} exists in "
            f"the media roots {[p.rstrip(os.sep) for p in self.root_prefixes]}"
        )

    # -- ingestion -----------------------------------------------------------------------------
    def _ingest(self, source: str, ref: MediaRef | None, where: str) -> MediaRef:
        try:
            st = os.stat(source)
        except FileNotFoundError:
            raise MediaMissingError(f"{self.dest}: {where}: media file {source} does not exist") from None
        if not stat.S_ISREG(st.st_mode):
            raise MediaMissingError(f"{self.dest}: {where}: media path {source} is not a regular file")
        if ref is not None and ref.size != st.st_size:
            raise MediaMissingError(
                f"{self.dest}: {where}: MediaRef for {source} expects {ref.size} bytes, found {st.st_size}"
            )
        suffix = ref.suffix if ref is not None else media_suffix(os.path.basename(source))
        claimed = ref.digest if ref is not None else digest_from_name(os.path.basename(source))
        if claimed is not None:
            stored = self.stored.get(claimed[len(DIGEST_PREFIX) :] + suffix)
            if stored is not None:
                if stored.size != st.st_size:
                    raise MediaMissingError(
                        f"{self.dest}: {where}: {source} claims digest {claimed} but has {st.st_size} bytes; the "
                        f"file already stored under that digest has {stored.size}"
                    )
                return stored
        if claimed is not None and self.link != "copy":
            # A trusted name can be linked straight to its final name: no temporary, no rename.
            final = trusted_ref(claimed, st.st_size, suffix)
            target = os.path.join(self.media_dir, final.filename)
            method = ingest(source, target, self.link, st.st_dev, self.media_dev)
            if method != "copy":
                self._stored_file(final, target, st.st_mode)
                return final
        self._tmp_counter += 1
        tmp = os.path.join(self.media_dir, f".ingest-{self._tmp_counter}")
        method = ingest(source, tmp, self.link, st.st_dev, self.media_dev)
        if method == "copy":
            hexdigest, size = copy_and_hash(source, tmp)
            mode = None
        else:
            hexdigest, size = sha256_file(tmp)
            mode = st.st_mode
        digest = DIGEST_PREFIX + hexdigest
        if claimed is not None and claimed != digest:
            os.unlink(tmp)
            raise MediaMissingError(
                f"{self.dest}: {where}: {source}: expected digest {claimed}, found {digest} (the file's "
                "content does not match its name or MediaRef)"
            )
        if size != st.st_size:
            os.unlink(tmp)
            raise MediaMissingError(f"{self.dest}: {where}: {source} changed size while being stored")
        final = trusted_ref(digest, size, suffix)
        if final.filename in self.stored:
            os.unlink(tmp)
            return final
        target = os.path.join(self.media_dir, final.filename)
        os.rename(tmp, target)
        self._stored_file(final, target, mode)
        return final

    def _stored_file(self, ref: MediaRef, path: str, mode: int | None) -> None:
        # A hard link shares the source's inode, so its known mode saves a stat; run media
        # stores write files read-only already, and then there is nothing to change.
        make_read_only(path, mode)
        self.durability.add(path)
        self.stored[ref.filename] = ref
        fault_point("write.media")
