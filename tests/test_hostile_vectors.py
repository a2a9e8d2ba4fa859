"""The hostile corpus under tests/vectors/hostile/: each vector refused with its error class and
message, at the level the table gives, by the reader and (packed files) by unpack, and the CLI
reports it without a traceback. Regenerate with ``python tests/vectors/hostile/generate.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

import bundles
from bundles import open_bundle, unpack_bundle
from bundles.cli import main

HOSTILE = Path(__file__).resolve().parent / "vectors" / "hostile"
TABLE: dict[str, dict] = json.loads((HOSTILE / "expected.json").read_text())
_spec = importlib.util.spec_from_file_location("hostile_generator", HOSTILE / "generate.py")
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(generator)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The committed vectors plus those made at test time, in a scratch copy (tests never touch
    the repository's files)."""
    out = tmp_path_factory.mktemp("hostile")
    for _name, row in TABLE.items():
        if not row["runtime"]:
            src = HOSTILE / row["path"]
            if src.is_dir():
                shutil.copytree(src, out / row["path"], symlinks=True)
            else:
                shutil.copy(src, out / row["path"])
    generator.make_specials(out)
    return out


def _attempt(path: Path, level: str) -> None:
    if level == "samples":
        with open_bundle(path, verify="none") as b:
            for _ in b.samples():
                pass
    else:
        open_bundle(path, verify=level).close()


def test_the_table_lists_every_vector_and_the_generator_agrees():
    # generate_<area>.py files write their own corpora, each in a folder with its own table.
    on_disk = {
        p.name
        for p in HOSTILE.iterdir()
        if not p.name.startswith("generate") and not (p / "expected.json").exists()
    } - {"expected.json", "__pycache__"}
    committed = {row["path"] for row in TABLE.values() if not row["runtime"]}
    assert on_disk == committed
    assert generator.table() == TABLE  # regenerate when this fails
    assert len(TABLE) >= 25


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_hostile_vector_is_refused_with_its_class_and_message(corpus, name):
    row = TABLE[name]
    path = corpus / row["path"]
    error = getattr(bundles, row["error"])
    # Accepted at every weaker level (the vector is refused where the table says, not earlier by
    # accident), refused at its level and every stronger one. "samples" reads every sample after
    # verify="none": shard contents are seen there, media only by verification.
    levels = ["none", "fast", "full", "samples"] if row["level"] == "samples" else ["none", "fast", "full"]
    at = levels.index(row["level"])
    for level in levels[:at]:
        open_bundle(path, verify=level).close()
    for level in levels[at:]:
        with pytest.raises(error) as e:
            _attempt(path, level)
        assert type(e.value) is error, (level, type(e.value), e.value)
        assert row["message"] in str(e.value), (level, str(e.value))
        assert str(path) in str(e.value)
    # The CLI reports it without a traceback.
    assert main(["verify", "--full", str(path)] if row["level"] != "samples" else ["show", str(path)]) == 1
    if row["packed"]:
        out = corpus / f"{name}.out"
        with pytest.raises(error) as e:
            unpack_bundle(path, out)
        assert row["message"] in str(e.value)
        assert not os.path.lexists(out)
        assert not [p for p in os.listdir(corpus) if p.startswith(f".{name}.out")]  # no staging left


def test_every_vector_is_refused(corpus, capsys):
    """The count for docs/RELIABILITY.md: every vector, every reader."""
    refused = 0
    for _name, row in TABLE.items():
        try:
            _attempt(corpus / row["path"], "samples" if row["level"] == "samples" else "full")
        except bundles.BundleError:
            refused += 1
    with capsys.disabled():
        print(f"\nhostile vectors refused: {refused} of {len(TABLE)}")
    assert refused == len(TABLE)
