"""One exit-status rule for every ``rollout-bundle`` subcommand (README.md, "Command line"):
0 success, 1 the bundle's problem (missing, unreadable, corrupt, failing the command's check),
2 the caller's (usage, values, an index out of range, an option's input that does not fit the
bundle, an output that exists without --force).

The table has rows for every subcommand the parser lists, at least one of each status; a new
subcommand without rows fails :func:`test_every_subcommand_has_a_row_of_each_status`. Every row
runs through ``main([...])`` and checks the status and that stderr is one
``rollout-bundle CMD: error: ...`` line without a traceback (argparse's own usage errors may put
the usage above that line, nothing else).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bundles import open_bundle, pack_bundle, write_bundle
from trainer_hooks.cli import build_parser, main

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_REPLAY = HAS_TORCH and importlib.util.find_spec("transformers") is not None
HAS_VIEW = importlib.util.find_spec("PIL") is not None and importlib.util.find_spec("jinja2") is not None


@dataclass
class Files:
    """What the rows run on, made once per test under ``tmp``."""

    tmp: Path
    good: Path  # a sound bundle of 3 samples
    other: Path  # another sound bundle
    corrupt: Path  # a bundle whose manifest is not JSON
    packed: Path  # ``good`` packed
    garbage: Path  # a file that is no packed bundle
    other_report: Path  # a replay report of ``other``

    def out(self, name: str) -> str:
        return str(self.tmp / "out" / name)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    from trainer_hooks.replay import bundle_identity

    good = write_bundle(tmp_path / "good", [{"index": i, "reward": float(i)} for i in range(3)])
    other = write_bundle(tmp_path / "other", [{"index": 7}])
    corrupt = write_bundle(tmp_path / "corrupt", [{"index": 0}])
    (corrupt / "manifest.json").write_text("{not json")
    garbage = tmp_path / "garbage.rbundle"
    garbage.write_bytes(b"no tar here" * 100)
    report = {
        "format": "rollout-bundle-replay",
        "version": 1,
        "bundle": str(other),
        "bundle_id": bundle_identity(open_bundle(other)),
        "samples": [],
        "summary": {},
    }
    other_report = tmp_path / "other.replay.json"
    other_report.write_text(json.dumps(report))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "exists.rbundle").write_bytes(b"")
    (tmp_path / "out" / "exists").mkdir()
    packed = pack_bundle(good, tmp_path / "good.rbundle")
    return Files(tmp_path, good, other, corrupt, packed, garbage, other_report)


@dataclass
class Row:
    command: str
    status: int
    argv: Callable[[Files], list[str]]
    says: str  # a piece of the error line
    needs: str = ""  # "torch", "replay" (torch + transformers), "view" (Pillow + Jinja2), "store"

    @property
    def id(self) -> str:
        return f"{self.command}-{self.status}-{self.says[:24]}"


ROWS = [
    Row("inspect", 1, lambda f: ["inspect", str(f.corrupt)], "manifest"),
    Row("inspect", 2, lambda f: ["inspect"], "the following arguments are required: BUNDLE"),
    Row("show", 1, lambda f: ["show", str(f.corrupt)], "manifest"),
    Row("show", 2, lambda f: ["show", str(f.good), "5"], "sample index 5 is out of range"),
    Row("show", 2, lambda f: ["show", str(f.good), "--keys", "rewrd"], "no such key path"),
    Row("diff", 1, lambda f: ["diff", str(f.corrupt), str(f.good)], "manifest"),
    Row("diff", 2, lambda f: ["diff", str(f.good), str(f.other), "--by", "task"], "has no key path 'task'"),
    Row("verify", 1, lambda f: ["verify", str(f.corrupt)], "manifest"),
    Row("verify", 1, lambda f: ["verify", str(f.tmp / "nothing")], "nothing"),
    Row("verify", 2, lambda f: ["verify"], "the following arguments are required: BUNDLE"),
    Row("pack", 1, lambda f: ["pack", str(f.corrupt), "-o", f.out("c.rbundle")], "manifest"),
    Row("pack", 2, lambda f: ["pack", str(f.good), "-o", f.out("exists.rbundle")], "pass --force"),
    Row("pack", 2, lambda f: ["pack", str(f.good), "-o", f.out("exists")], "is a directory"),
    Row("unpack", 1, lambda f: ["unpack", str(f.garbage), "-o", f.out("u")], "garbage.rbundle"),
    Row("unpack", 2, lambda f: ["unpack", str(f.packed), "-o", f.out("exists")], "pass --force"),
    Row("ls", 1, lambda f: ["ls", str(f.tmp / "nothing")], "does not exist"),
    Row("ls", 2, lambda f: ["ls"], "the following arguments are required: ROOT"),
    Row("export", 1, lambda f: ["export", str(f.tmp / "nothing"), "-o", f.out("x")], "does not exist"),
    Row("export", 2, lambda f: ["export", str(f.tmp)], "the following arguments are required: -o/--output"),
    Row("cp", 1, lambda f: ["cp", str(f.tmp / "nothing"), f.out("c.rbundle")], "nothing"),
    Row("cp", 2, lambda f: ["cp", str(f.good), f.out("copy")], "cp copies a bundle between"),
    Row("rm", 1, lambda f: ["rm", str(f.tmp / "nothing")], "no bundle here"),
    Row("rm", 2, lambda f: ["rm"], "the following arguments are required: BUNDLE"),
    Row("gc", 1, lambda f: ["gc", "s3://no-such-bucket-24/run"], "no-such-bucket-24", needs="store"),
    Row("gc", 2, lambda f: ["gc", str(f.good)], "gc takes an object-store URL"),
    Row("view", 1, lambda f: ["view", str(f.corrupt), "-o", f.out("v.html")], "manifest", needs="view"),
    Row(
        "view",
        2,
        lambda f: ["view", str(f.good), "-o", f.out("v.html"), "--replay", str(f.other_report)],
        "a replay report of another bundle",
        needs="view",
    ),
    Row(
        "view",
        2,
        lambda f: ["view", str(f.good), "-o", f.out("v.html"), "--samples", "1,9"],
        "sample 9 is out of range",
        needs="view",
    ),
    Row(
        "serve",
        1,
        lambda f: ["serve", str(f.tmp / "nothing"), "--port", "0"],
        "no such directory",
        needs="view",
    ),
    Row("serve", 2, lambda f: ["serve", str(f.good), "--port", "70000"], "expected a port 0..65535"),
    Row("sweep", 1, lambda f: ["sweep", str(f.tmp / "no-media-root")], "no-media-root"),
    Row("sweep", 2, lambda f: ["sweep", str(f.tmp), "--older-than", "soon"], "--older-than"),
    Row(
        "import-dump",
        1,
        lambda f: ["import-dump", str(f.garbage), "-o", f.out("i"), "--trust-pickle"],
        "garbage.rbundle",
        needs="torch",
    ),
    Row("import-dump", 2, lambda f: ["import-dump", str(f.garbage), "-o", f.out("i")], "--trust-pickle"),
    Row("replay", 1, lambda f: ["replay", str(f.corrupt), "--no-progress"], "manifest", needs="replay"),
    Row(
        "replay",
        2,
        lambda f: ["replay", str(f.good), "--expect", str(f.other_report)],
        "a replay report of another bundle",
    ),
    Row("replay", 2, lambda f: ["replay", str(f.good), "--limit", "0"], "--limit must be at least 1"),
]


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_subcommand_has_a_row_of_each_status() -> None:
    have = {(r.command, r.status) for r in ROWS}
    missing = sorted((c, s) for c in subcommands() for s in (1, 2) if (c, s) not in have)
    assert missing == [], f"add rows to tests/test_cli_exit_codes.py for {missing}"
    assert {r.command for r in ROWS} <= subcommands()


def _skip_unless(needs: str, request: pytest.FixtureRequest) -> None:
    if needs == "torch" and not HAS_TORCH:
        pytest.skip("needs torch")
    if needs == "replay" and not HAS_REPLAY:
        pytest.skip("needs torch and transformers")
    if needs == "view" and not HAS_VIEW:
        pytest.skip("needs Pillow and Jinja2")
    if needs == "store":
        server: Any = request.getfixturevalue("moto_s3")  # skips without moto[server]
        mp = request.getfixturevalue("monkeypatch")
        for k, v in server.env.items():
            mp.setenv(k, v)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_exit_status_follows_the_rule(
    row: Row, files: Files, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    _skip_unless(row.needs, request)
    argv = row.argv(files)
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's usage errors
        status = e.code if isinstance(e.code, int) else 2
    err = capsys.readouterr().err
    assert status == row.status, f"{argv}: exit {status}, expected {row.status}:\n{err}"
    lines = err.splitlines()
    assert "Traceback" not in err and lines, err
    assert lines[-1].startswith(f"rollout-bundle {row.command}: error: "), err
    assert row.says in lines[-1], err
    above = lines[:-1]  # argparse's usage only, and only for its own errors
    assert not above or (
        above[0].startswith("usage: ") and all(line.startswith(" ") for line in above[1:])
    ), err
    if row.status == 1:
        assert not above, err
    if "out" in os.listdir(files.tmp):
        assert sorted(os.listdir(files.tmp / "out")) == ["exists", "exists.rbundle"], (
            "a refused command wrote"
        )
