"""Media references in samples: path strings and ``MediaRef`` values, alone or in long lists
mixed with numbers and other strings, nested, before and after the run directory is deleted.

Lists of more than a few numbers take the encoder's fast path (packed as they are); a list that
holds paths or references must never take it. The strategies below draw long lists (up to 100
items) of each kind and of mixtures, with path strings inside and outside the media roots.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import MediaRef, open_bundle, write_bundle

PAYLOADS = [bytes([i]) * (50 + 17 * i) for i in range(6)]  # media files, distinct sizes and digests


@dataclass(frozen=True)
class Tok:
    """A placeholder the strategies draw; :class:`World` turns it into a real value.

    kinds: ``in`` a path string to media file k inside a media root; ``ref`` a MediaRef to it
    with its path; ``bare`` a MediaRef without a path (found in the media roots by digest);
    ``out`` the k-th kind of string that is not a reference (see ``World.outside``).
    """

    kind: str
    k: int


class World:
    """Two media roots holding the PAYLOADS, and strings that look like paths but are not
    references, all under ``base``."""

    def __init__(self, base: Path) -> None:
        self.shared = base / "shared"
        self.roots = [self.shared / "run-a", self.shared / "run-b"]
        # Files alternate between the two roots; one name per file, content-addressed.
        self.paths = [put_media(self.roots[i % 2], p) for i, p in enumerate(PAYLOADS)]
        self.bytes_of = dict(zip(self.paths, PAYLOADS, strict=True))
        elsewhere = base / "elsewhere"
        elsewhere.mkdir()
        outside_file = elsewhere / (hashlib.sha256(b"outside").hexdigest() + ".png")
        outside_file.write_bytes(b"outside")
        root = str(self.roots[0])
        self.outside = [
            str(outside_file),  # an existing media-like file, but outside every root
            str(elsewhere / "missing.png"),  # absent, outside every root
            root,  # a root itself is not a file in it
            root + "-sibling/" + Path(self.paths[0]).name,  # shares the prefix, not the directory
            root + "/../elsewhere/" + outside_file.name,  # spelled inside, resolves outside
            "run-a/" + Path(self.paths[0]).name,  # relative
            "click at (3, 4) in /usr/share/icons",
            "",
        ]

    def make(self, value: Any) -> Any:
        if isinstance(value, Tok):
            path = self.paths[value.k % len(self.paths)]
            if value.kind == "in":
                return path
            if value.kind == "ref":
                return MediaRef.from_file(path)
            if value.kind == "bare":
                return MediaRef.from_file(path).with_path(None)
            return self.outside[value.k % len(self.outside)]
        if isinstance(value, list):
            return [self.make(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.make(v) for v in value)
        if isinstance(value, dict):
            return {k: self.make(v) for k, v in value.items()}
        return value

    def referenced(self, value: Any) -> set[str]:
        """The media paths a materialized value references."""
        if isinstance(value, MediaRef):
            return {self._path_of(value)}
        if isinstance(value, str):
            return {value} if value in self.bytes_of else set()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            return set().union(*(self.referenced(v) for v in value)) if value else set()
        return set()

    def _path_of(self, ref: MediaRef) -> str:
        (path,) = [p for p in self.paths if Path(p).name == ref.filename]
        return path


def check_loaded(world: World, original: Any, loaded: Any, media_dir: Path, where: str = "sample") -> None:
    """``loaded`` equals ``original`` value for value and type for type, except that every
    reference now points at a file in ``media_dir`` holding the referenced bytes."""
    if isinstance(original, str) and original in world.bytes_of:
        assert isinstance(loaded, str), where
        assert Path(loaded).parent == media_dir, where
        assert Path(loaded).read_bytes() == world.bytes_of[original], where
    elif isinstance(original, MediaRef):
        assert isinstance(loaded, MediaRef), where
        assert (loaded.digest, loaded.size, loaded.suffix) == (
            original.digest,
            original.size,
            original.suffix,
        ), where
        assert loaded.path is not None and Path(loaded.path).parent == media_dir, where
        assert hashlib.sha256(Path(loaded.path).read_bytes()).hexdigest() == original.hexdigest, where
    elif isinstance(original, dict):
        assert type(loaded) is dict and list(loaded) == list(original), where
        for k in original:
            check_loaded(world, original[k], loaded[k], media_dir, f"{where}[{k!r}]")
    elif isinstance(original, (list, tuple)):
        assert type(loaded) is type(original) and len(loaded) == len(original), where
        for i, (x, y) in enumerate(zip(original, loaded, strict=True)):
            check_loaded(world, x, y, media_dir, f"{where}[{i}]")
    else:
        assert type(loaded) is type(original) and loaded == original, where


# -- strategies -----------------------------------------------------------------------------------

numbers = st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.booleans()
ref_toks = st.builds(Tok, st.sampled_from(["in", "ref", "bare"]), st.integers(0, len(PAYLOADS) - 1))
out_toks = st.builds(Tok, st.just("out"), st.integers(0, 7))
leaf = numbers | ref_toks | out_toks | st.none() | st.text(max_size=8)


def long_lists(items: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """Lists of 5 to 100 items, lengths drawn evenly (hypothesis' own lists stay short)."""
    return st.integers(5, 100).flatmap(lambda n: st.lists(items, min_size=n, max_size=n))


in_toks = st.builds(Tok, st.just("in"), st.integers(0, len(PAYLOADS) - 1))
small = (
    st.lists(leaf, max_size=3)
    | st.lists(leaf, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=4), leaf, max_size=3)
)
# Homogeneous long lists (the shapes the fast path sees), mixtures, and mixtures holding
# small containers; then nesting of all of them in lists, tuples and dicts.
long = (
    long_lists(in_toks)
    | long_lists(st.builds(Tok, st.sampled_from(["ref", "bare"]), st.integers(0, len(PAYLOADS) - 1)))
    | long_lists(out_toks)
    | long_lists(st.integers(-5, 5) | in_toks)
    | long_lists(st.floats(allow_nan=False) | ref_toks)
    | long_lists(leaf | small)
)
nested = st.recursive(
    leaf | long,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
samples_strategy = st.lists(
    st.dictionaries(st.sampled_from(["images", "mm", "tokens", "x"]), nested, min_size=1, max_size=3),
    min_size=1,
    max_size=3,
)

FIXTURE_OK = settings(
    max_examples=30,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@FIXTURE_OK
@given(drawn=samples_strategy)
def test_mixed_long_lists_round_trip(tmp_path_factory, drawn):
    base = tmp_path_factory.mktemp("mixed")
    world = World(base)
    samples = world.make(drawn)
    dest = write_bundle(base / "bundle", samples, media_roots=world.roots, outside_paths="keep")
    bundle = open_bundle(dest, verify="full")
    assert len(bundle) == len(samples)
    assert {r.filename for r in bundle.media} == {Path(p).name for p in world.referenced(samples)}
    for i, (original, loaded) in enumerate(zip(samples, bundle.samples(), strict=True)):
        check_loaded(world, original, loaded, dest / "media", f"samples[{i}]")


@FIXTURE_OK
@given(drawn=samples_strategy)
def test_every_reference_resolves_inside_the_bundle_once_the_run_directory_is_gone(tmp_path_factory, drawn):
    base = tmp_path_factory.mktemp("gone")
    world = World(base)
    samples = world.make(drawn)
    dest = write_bundle(base / "bundle", samples, media_roots=world.roots, outside_paths="keep")
    shutil.rmtree(world.shared)
    bundle = open_bundle(dest, verify="full")
    loaded = list(bundle.samples())
    for i, (original, back) in enumerate(zip(samples, loaded, strict=True)):
        check_loaded(world, original, back, dest / "media", f"samples[{i}]")
    # And into a new run directory: the same samples, now pointing there.
    new_run = base / "shared" / "run-c"
    for i, (original, back) in enumerate(zip(samples, bundle.rehydrate(new_run), strict=True)):
        check_loaded(world, original, back, new_run, f"samples[{i}]")


def test_long_lists_of_paths_and_refs_are_references_not_numbers(tmp_path):
    """The fast path for flat number lists must not swallow lists of paths or MediaRefs."""
    world = World(tmp_path)
    paths = [world.paths[i % 6] for i in range(12)]
    sample = {
        "images": paths,
        "refs": [MediaRef.from_file(p) for p in paths],
        "bare_refs": [MediaRef.from_file(p).with_path(None) for p in paths[:5]],
        "mixed": [1, 2, 3, 4, paths[0], 5.0],
        "strings": ["a", "b", "c", "d", "e", world.outside[0]],
        "tokens": list(range(100)),
        "logprobs": [-0.5] * 100,
    }
    dest = write_bundle(tmp_path / "bundle", [sample], media_roots=world.roots, outside_paths="keep")
    shutil.rmtree(world.shared)
    (loaded,) = open_bundle(dest, verify="full").samples()
    check_loaded(world, sample, loaded, dest / "media")
    assert all(p.startswith(str(dest / "media") + os.sep) for p in loaded["images"])
    assert loaded["strings"] == sample["strings"] and loaded["tokens"] == sample["tokens"]


@pytest.mark.parametrize("n", [4, 5, 100])
def test_a_list_of_n_paths_survives_the_run_directory(tmp_path, n):
    world = World(tmp_path)
    paths = [world.paths[i % 6] for i in range(n)]
    dest = write_bundle(
        tmp_path / "bundle", [{"images": paths}], media_roots=world.roots, outside_paths="keep"
    )
    shutil.rmtree(world.shared)
    (loaded,) = open_bundle(dest, verify="full").samples()
    assert [Path(p).read_bytes() for p in loaded["images"]] == [PAYLOADS[i % 6] for i in range(n)]
