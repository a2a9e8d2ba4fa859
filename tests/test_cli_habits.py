"""What every ``rollout-bundle`` subcommand shares: help, --version, one error prefix without
tracebacks, exit statuses, --json, --progress and messages that name the CLI's flags."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import put_media

import bundles
from bundles import write_bundle
from trainer_hooks.cli import build_parser, main


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``rollout-bundle ARGS`` as a real process (no terminal: stdin, stdout, stderr are pipes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def small_bundle(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    samples = [{"images": [put_media(run, bytes([i]) * 2048)], "reward": float(i)} for i in range(3)]
    return write_bundle(tmp_path / "b", samples, media_roots=[run], meta={"rollout_id": 1})


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_a_one_line_summary_and_helped_positionals():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in action._choices_actions}
    assert {"inspect", "show", "diff", "verify", "pack", "unpack", "sweep", "import-dump"} <= set(summaries)
    for name, sub in subcommands().items():
        assert summaries[name] and "\n" not in summaries[name], name
        assert sub.description, name
        assert sub.prog == f"rollout-bundle {name}"
        for a in sub._actions:
            if not a.option_strings:
                assert a.help, f"{name}: positional {a.dest} has no help"


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rollout-bundle {bundles.__version__} ") and "format_version" in out


def test_every_reporting_command_takes_json():
    reporting = {"inspect", "diff", "verify", "pack", "unpack", "sweep", "import-dump"}  # show prints JSON
    for name, sub in subcommands().items():
        flags = {f for a in sub._actions for f in a.option_strings}
        if name in reporting:
            assert "--json" in flags, name


def test_verify_json_lists_every_problem(tmp_path, capsys):
    b = small_bundle(tmp_path)
    assert main(["verify", str(b), "--full", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {
        "path": str(b),
        "level": "full",
        "ok": True,
        "samples": 3,
        "media_files": 3,
        "problems": [],
    }
    for f in sorted((b / "media").iterdir())[:2]:
        os.chmod(f, 0o644)
        f.write_bytes(b"z" * f.stat().st_size)
    assert main(["verify", str(b), "--full", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["problems"]) == 2
    assert all("digest: expected sha256:" in p for p in report["problems"])


def test_expected_failures_are_one_prefixed_line_without_traceback(tmp_path):
    b = small_bundle(tmp_path)
    packed = tmp_path / "b.rbundle"
    assert cli("pack", str(b), "-o", str(packed)).returncode == 0

    r = cli("pack", str(b), "-o", str(packed))  # exists: the message names the flag, not the API
    assert r.returncode == 2  # the caller's to fix (--force): tests/test_cli_exit_codes.py
    assert r.stderr == f"rollout-bundle pack: error: {packed}: output exists; pass --force to replace it\n"

    r = cli("unpack", str(tmp_path / "gone.rbundle"), "-o", str(tmp_path / "u"))
    assert r.returncode == 1
    assert r.stderr.startswith("rollout-bundle unpack: error: ") and "gone.rbundle" in r.stderr
    assert "does not exist" in r.stderr

    (tmp_path / "plain").write_text("x")  # an OSError on a path the user named
    r = cli("pack", str(b), "-o", str(tmp_path / "plain" / "out.rbundle"))
    assert r.returncode == 1 and r.stderr.startswith("rollout-bundle pack: error: ")
    assert "plain" in r.stderr

    r = cli("verify", str(tmp_path / "nothing"))
    assert r.returncode == 1 and r.stderr.startswith("rollout-bundle verify: error: ")

    r = cli("inspect")  # bad usage: argparse's message, same prefix, status 2
    assert r.returncode == 2 and "rollout-bundle inspect: error: " in r.stderr

    r = cli("no-such-command")
    assert r.returncode == 2 and "rollout-bundle: error: " in r.stderr
    for r in (cli("verify", str(tmp_path / "nothing")), cli("inspect", str(tmp_path / "plain"))):
        assert "Traceback" not in r.stderr, r.stderr


def test_import_dump_refusal_is_a_usage_error_naming_the_flag(tmp_path):
    src = tmp_path / "old.pt"
    src.write_bytes(b"not read")
    r = cli("import-dump", str(src), "-o", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr.startswith(f"rollout-bundle import-dump: error: {src}: refusing to load")
    assert "pass --trust-pickle only" in r.stderr and "trust_pickle=True" not in r.stderr


def test_progress_flag_forces_the_line_on_and_off(tmp_path):
    b = small_bundle(tmp_path)
    on = cli("verify", str(b), "--full", "--progress")
    off = cli("verify", str(b), "--full", "--no-progress")
    default = cli("verify", str(b), "--full")  # stderr is a pipe: no progress by default
    assert on.returncode == off.returncode == default.returncode == 0
    assert "verifying b [" in on.stderr and "100.0%" in on.stderr
    assert off.stderr == default.stderr == ""
