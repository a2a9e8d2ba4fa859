"""The media a rollout journal's records reference: found, placed and accounted for.

A record's body references media the way a bundle's samples do (path strings under the run's
media roots, :class:`bundles.MediaRef`, PIL images); the encoder resolves each through
:class:`JournalMedia`, which hard-links the file into the journal's ``media/`` directory the
first time it is seen (:func:`bundles.support.place_file`: hard link, else copy), so a teardown
of the run cannot take it, and tells the encoder the stored name. Run media names are content
digests, so nothing is hashed on this path; a file under a media root with another name is
hashed once. Placed files are durable with the journal's next flush (its fsync of new media, or
its shipment on a store), not one by one here.

One per :class:`~._writer.RolloutJournal`, used on its writer thread only (compaction forgets
names under the journal's lock).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bundles import MediaRef
from bundles.support import fault_point, place_file
from trainer_hooks.journal._format import JournalError, is_content_name

__all__ = ["JournalMedia"]

# Path strings remembered with their references (the same screenshot in many samples).
_BY_VALUE_LIMIT = 1 << 16


class JournalMedia:
    """See the module docstring. ``count(how)`` is told each placement (``"hardlink"``,
    ``"copy"``), for the journal's flush statistics."""

    def __init__(
        self,
        media_dir: Path,
        roots: Sequence[str | os.PathLike[str]],
        *,
        link: str,
        store_image: Callable[[Any, str], MediaRef] | None,
        count: Callable[[str], None],
    ) -> None:
        self.dir = media_dir
        self.roots = tuple(os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots)
        self.link = link
        self._store_image = store_image
        self._count = count
        self.known: set[str] = set()  # names placed in ``dir`` (and not compacted away)
        self.new: list[str] = []  # paths placed since the last flush took them
        self.new_bytes = 0  # their bytes
        self._by_value: dict[str, MediaRef] = {}

    def take_new(self) -> list[str]:
        """The files placed since the last call (the flush makes them durable)."""
        new, self.new = self.new, []
        self.new_bytes = 0
        return new

    def forget(self, names: Sequence[str] | set[str]) -> None:
        """These names are no longer in the journal: referenced again, they are placed again."""
        self.known.difference_update(names)

    def string(self, value: str, where: str, media: list[str]) -> MediaRef | None:
        """A path string under a media root as the reference it stands for (None: not media)."""
        known = self._by_value.get(value)
        if known is not None and known.filename in self.known:
            media.append(known.filename)  # the same screenshot in many samples: resolved once
            return known
        norm = os.path.normpath(value)
        if not norm.startswith(self.roots) or not os.path.isfile(norm):
            return None
        name = os.path.basename(norm)
        if is_content_name(name):
            size = os.stat(norm).st_size
            ref = MediaRef("sha256:" + name.split(".", 1)[0], size, os.path.splitext(name)[1])
        else:
            ref = MediaRef.from_file(norm)
        self._place(norm, ref, where)
        if len(self._by_value) < _BY_VALUE_LIMIT:
            self._by_value[value] = ref
        media.append(ref.filename)
        return ref

    def ref(self, ref: MediaRef, where: str, media: list[str]) -> MediaRef:
        """A :class:`MediaRef`, its file placed (found under a media root when it has no path)."""
        source = ref.path
        if source is None:
            for root in self.roots:
                if os.path.exists(root + ref.filename):
                    source = root + ref.filename
                    break
        if source is None:
            if ref.filename not in self.known:
                raise JournalError(f"{where}: MediaRef {ref.digest} has no path and is in no media root")
        else:
            self._place(source, ref, where)
        media.append(ref.filename)
        return MediaRef(ref.digest, ref.size, ref.suffix)

    def image(self, image: Any, where: str, media: list[str]) -> MediaRef:
        """A PIL image, stored in a media root first (``store_image``)."""
        assert self._store_image is not None
        return self.ref(self._store_image(image, where), where, media)

    def _place(self, source: str, ref: MediaRef, where: str) -> None:
        name = ref.filename
        if name in self.known:
            return
        target = str(self.dir / name)
        fault_point("journal.link", name)
        try:
            how = place_file(source, target, link=self.link)
        except OSError as e:
            raise JournalError(f"{where}: cannot link {source} into {self.dir}: {e}") from None
        self._count("copy" if how == "copy" else "hardlink")
        self.known.add(name)
        self.new.append(target)
        self.new_bytes += ref.size
