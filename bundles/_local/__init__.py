"""The local half: a bundle on a filesystem, written, committed, proven, read and packed.

Filesystem primitives (:mod:`.fs`: ingesting media by hardlink, reflink or copy, fsync, renames,
the one tree deletion), the one atomic file write (:mod:`.atomic`), the commit protocol of a
bundle directory (:mod:`.commit`: staging beside the destination, the manifest last) and the proof
that a location holds a bundle (:mod:`.proof`); the writer (:mod:`.writer`, and :mod:`.ingest`: the media a sample references) and the reader
(:mod:`.reader`: :class:`~bundles.Bundle`); where a reader's bytes come from (:mod:`.sources`:
the :class:`~.sources.Source` interface, a directory, and :mod:`.archive`: a packed file); packing
(:mod:`.pack`). Beside them what the protocol leans on: process identity (:mod:`.proc`), named
fault points (:mod:`.faults`) and the progress line (:mod:`.progress`).

This folder imports the format (:mod:`bundles._format`), :mod:`bundles._errors` and
:mod:`bundles._urls` (to refuse a URL where only a path makes sense), never the store half
(:mod:`bundles._store`, which builds on this one): ``tests/test_architecture.py`` checks it.
"""
