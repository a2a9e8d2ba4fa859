"""What ``rollout-bundle`` prints, run as a user runs it (a subprocess): names and texts read from a
bundle or a listing reach the terminal only through ``bundles.support.display`` (issue 36, item 8),
``ls`` lists every good entry whatever one bad entry holds and says so in its status (item 8),
``ls -r`` finds a run's bundles below its root (item 20), ``inspect`` of a path that is no bundle
says so (item 18), and a typo in a subcommand's flag prints that subcommand's usage (item 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bundles import write_bundle
from bundles.support import display

ROOT = Path(__file__).resolve().parents[1]

# What a terminal acts on: ESC (colours, clearing the screen, a title), the C1 CSI, a right-to-left
# override (reverses what follows), and a raw newline inside a name (a forged line).
RAW = ("\x1b", "\x9b", "\u202e")


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a subprocess; bytes out, so that nothing is decoded on the way."""
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", *argv],
        capture_output=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def text(raw: bytes) -> str:
    out = raw.decode("utf-8")  # strict: a lone surrogate or a stray byte would not decode
    for ch in RAW:
        assert ch not in out, (ch, out)
    return out


HOSTILE_NAMES = [
    "evil\nrollout-bundle: forged line",
    "red\x1b[31mtext\x1b[0m",
    "rtl\u202eexe.txt",
    "csi\x9b2J",
]


def test_ls_prints_every_name_escaped_one_line_each(tmp_path: Path) -> None:
    run = tmp_path / "run"
    names = ["ok", *HOSTILE_NAMES]
    for name in names:
        write_bundle(run / name, [{"index": 0}])
    raw_name = os.fsencode(run) + b"/latin1-\xff"  # a name that is not UTF-8
    write_bundle(os.fsdecode(raw_name), [{"index": 0}])
    (run / "notes\nFORGED.txt").write_text("a user's file, no bundle")
    done = cli("ls", str(run))
    assert done.returncode == 0, done.stderr
    lines = text(done.stdout).splitlines()
    expected = sorted([str(run / n) for n in names] + [os.fsdecode(raw_name)])
    assert lines == [display(p, limit=4096) for p in expected]
    assert f"{run}/latin1-\\xff" in lines and f"{run}/evil\\nrollout-bundle: forged line" in lines
    long = cli("ls", "-l", str(run))
    assert long.returncode == 0 and len(text(long.stdout).splitlines()) == len(expected), long.stderr


def _damage(bundle: Path) -> None:
    (bundle / "manifest.json").write_text('{"format": "rollout-bundle", "format_version": ')


def test_ls_lists_every_good_bundle_when_one_cannot_be_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for name in ("a", "b\x1b[2J", "c"):
        write_bundle(run / name, [{"index": 0}])
    _damage(run / "b\x1b[2J")
    plain = cli("ls", str(run))  # reads no manifest: whether it names the damaged one is the proof's rule
    assert str(run / "a") in text(plain.stdout) and str(run / "c") in text(plain.stdout), plain.stderr
    for argv in (["ls", "-l", str(run)], ["ls", "--json", "-l", str(run)]):
        done = cli(*argv)
        out, err = text(done.stdout), text(done.stderr)
        assert str(run / "a") in out and str(run / "c") in out, (argv, out, err)
        # The damaged bundle is either not a bundle at all (exit 0), or one line on stderr naming
        # it, escaped (exit 1): never the listing's end.
        if done.returncode == 1:
            (line,) = err.splitlines()
            assert line.startswith(f"rollout-bundle ls: not listed: {run}/b\\x1b[2J"), line
            assert "b\\x1b[2J" not in out
        else:
            assert done.returncode == 0 and "b\\x1b[2J" not in out + err, (argv, out, err)
    helped = text(cli("ls", "--help").stdout)
    assert "Exit status: 0 when every entry was listed, 1 when some entry" in " ".join(helped.split())


def test_ls_on_a_store_lists_the_good_bundles_beside_one_whose_manifest_is_gone(
    moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    from helpers.store import _boto

    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    for name in ("good", "gone", "zed"):
        write_bundle(f"s3://{bucket}/run/{name}", [{"index": 0}])
    client = _boto(moto_s3.endpoint)
    listed = client.list_objects_v2(Bucket=bucket, Prefix="run/gone/")["Contents"]
    (manifest,) = [o["Key"] for o in listed if o["Key"].endswith("/manifest.json")]
    client.delete_object(Bucket=bucket, Key=manifest)
    user_file = "run/notes.txt"
    client.put_object(Bucket=bucket, Key=user_file, Body=b"a user's file")
    for argv in (["ls", f"s3://{bucket}/run"], ["ls", "-l", f"s3://{bucket}/run"]):
        done = cli(*argv, env=moto_s3.env)
        out, err = text(done.stdout), text(done.stderr)
        assert f"s3://{bucket}/run/good" in out and f"s3://{bucket}/run/zed" in out, (argv, out, err)
        if f"s3://{bucket}/run/gone" in out:  # listed without -l (its pointer is there)
            assert argv[1] != "-l" and done.returncode == 0
        elif done.returncode == 1:
            (line,) = err.splitlines()
            assert line.startswith(f"rollout-bundle ls: not listed: s3://{bucket}/run/gone: "), line
        else:
            assert done.returncode == 0 and "gone" not in err, (argv, out, err)
    assert client.get_object(Bucket=bucket, Key=user_file)["Body"].read() == b"a user's file"

    # ls -r on a store: the run layout's sub-prefixes, never a generation or the media pool.
    deep = [f"s3://{bucket}/run/ckpt/rollout/fully_async_1", f"s3://{bucket}/run/debug/rollout_0.bundle"]
    for url in deep:
        write_bundle(url, [{"index": 0}])
    walked = cli("ls", "-r", f"s3://{bucket}/run", env=moto_s3.env)
    found = text(walked.stdout).splitlines()
    assert all(url in found for url in deep) and f"s3://{bucket}/run/good" in found, walked.stderr
    assert not any("/g2" in line or "/.media" in line for line in found), found
    # A key obstore cannot parse (a control character) fails the whole listing page: ls says so
    # in one escaped line, exit 1 (a limit of the store client, bundles/_commands/find.py).
    client.put_object(Bucket=bucket, Key="odd/evil\x1b[31mX/bundle.json", Body=b"{}")
    odd = cli("ls", f"s3://{bucket}/odd", env=moto_s3.env)
    (line,) = text(odd.stderr).splitlines()
    assert odd.returncode == 1 and line.startswith(f"rollout-bundle ls: not listed: s3://{bucket}/odd"), line


def test_ls_r_finds_a_runs_bundles_below_the_root(tmp_path: Path) -> None:
    run = tmp_path / "run"
    deep = [run / "ckpt" / "rollout" / "fully_async_3", run / "debug" / "rollout_3.bundle"]
    for where in deep:
        write_bundle(where, [{"index": 0}])
    write_bundle(run / ".hidden" / "b", [{"index": 0}])  # a hidden name is not looked into
    write_bundle(deep[0] / "nested", [{"index": 0}])  # nor a bundle
    too_deep = run / "a" / "b" / "c" / "d" / "e" / "f"
    write_bundle(too_deep, [{"index": 0}])
    (run / "ckpt" / "notes.txt").write_text("a user's file")
    flat = cli("ls", str(run))
    assert flat.returncode == 0 and flat.stdout == b""
    assert text(flat.stderr).strip() == (
        f"rollout-bundle ls: {run}: no bundle right under it (ls -r looks 4 levels down)"
    )
    done = cli("ls", "-r", str(run))
    assert done.returncode == 0, done.stderr
    assert text(done.stdout).splitlines() == sorted(str(p) for p in deep)
    rows = json.loads(cli("ls", "-r", "--json", str(run)).stdout)
    assert [r["location"] for r in rows] == sorted(str(p) for p in deep)


def test_ls_of_a_packed_bundle_lists_it_and_of_another_file_says_what_it_is(tmp_path: Path) -> None:
    from bundles import pack_bundle

    write_bundle(tmp_path / "b", [{"index": 0}])
    pack_bundle(tmp_path / "b", tmp_path / "b.rbundle")
    for flags in ([], ["-r"]):
        done = cli("ls", *flags, str(tmp_path / "b.rbundle"))
        assert done.returncode == 0 and text(done.stdout).splitlines() == [str(tmp_path / "b.rbundle")], (
            done.stderr
        )
    notes = tmp_path / "notes.txt"
    notes.write_text("a user's file")
    done = cli("ls", "-r", str(notes))
    assert done.returncode == 1 and done.stdout == b""
    assert (
        text(done.stderr).strip()
        == f"rollout-bundle ls: not listed: {notes}: not a bundle, nor a directory to look into"
    )
    assert notes.read_text() == "a user's file"


def test_show_inspect_diff_and_verify_print_nothing_raw(tmp_path: Path) -> None:
    meta = {"note": "x\x1b]0;owned\x07y", "rtl": "\u202eabc", "lone": "\ud800", "c1": "\x9b31m"}
    a, b = tmp_path / "a\x1b[1m", tmp_path / "b"
    write_bundle(a, [{"index": 0, "text\nkey": "red\x1b[31m", "r": "\u202e"}], meta=meta)
    write_bundle(b, [{"index": 0, "text\nkey": "blue\x1b[34m", "r": "\u2066"}], meta={**meta, "note": "z"})
    for argv in (
        ["inspect", str(a)],
        ["inspect", "--json", str(a)],
        ["show", str(a)],
        ["show", str(a), "--keys", "text\nkey,r"],
        ["diff", str(a), str(b)],
        ["diff", "--json", str(a), str(b)],
        ["verify", str(a)],
        ["ls", str(tmp_path)],
    ):
        done = cli(*argv)
        assert done.returncode in (0, 1), (argv, done.stderr)
        text(done.stdout), text(done.stderr)
    shown = json.loads(cli("show", str(a)).stdout)  # still JSON, and the same values
    assert shown[0]["sample"]["text\nkey"] == "red\x1b[31m" and shown[0]["sample"]["r"] == "\u202e"
    info = text(cli("inspect", str(a)).stdout)
    assert f"bundle        {tmp_path}/a\\x1b[1m" in info and '"rtl": "\\u202eabc"' in info
    diff = text(cli("diff", str(a), str(b)).stdout)
    assert 'text\\nkey: "red\\u001b[31m" -> "blue\\u001b[34m"' in diff, diff


def test_an_error_naming_an_untrusted_path_is_one_escaped_line(tmp_path: Path) -> None:
    where = tmp_path / "no\nrollout-bundle verify: OK\x1b[2J"
    where.mkdir()
    for command in ("inspect", "show", "verify"):
        done = cli(command, str(where))
        err = text(done.stderr)
        assert done.returncode == 1 and len(err.splitlines()) == 1, err
        assert err.startswith(
            f"rollout-bundle {command}: error: {tmp_path}/no\\nrollout-bundle verify: OK\\x1b[2J"
        )


def test_inspect_of_a_path_that_is_no_bundle_says_so_beside_a_journal(tmp_path: Path) -> None:
    save = tmp_path / "save"
    (save / "rollout" / "journal").mkdir(parents=True)
    write_bundle(save / "rollout" / "fully_async_1", [{"index": 0}])
    typo = save / "rollout" / "fully_async_2"
    for path in (typo, save / "rollout" / "typo"):
        done = cli("inspect", str(path))
        err = text(done.stderr)
        assert done.returncode == 1 and done.stdout == b"", (done.stdout, err)
        assert err.startswith(f"rollout-bundle inspect: error: {path}: no bundle here"), err
        assert cli("verify", str(path)).returncode == 1
    beside = cli("inspect", str(save / "rollout" / "fully_async_1"))  # a checkpoint: journal beside it
    assert beside.returncode == 0 and b"journal       " in beside.stdout, beside.stderr
    held = cli("inspect", str(save))  # a directory holding a journal: its state
    assert held.returncode == 0 and b"journal       " in held.stdout, held.stderr


def test_a_typo_in_a_subcommands_flag_prints_that_subcommands_usage() -> None:
    done = cli("ls", "--lnog", "x")
    err = text(done.stderr)
    assert done.returncode == 2
    assert err.startswith("usage: rollout-bundle ls [-h]"), err
    assert "rollout-bundle ls: error: unrecognized arguments: --lnog" in err


def test_the_dashboard_launcher_without_miles_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.miles.dashboard", "--dump-details", str(tmp_path)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # no Miles checkout on the path
        timeout=120,
        cwd=tmp_path,
    )
    err = text(done.stderr)
    assert done.returncode == 2 and done.stdout == b"", err
    assert err == (
        "trainer_hooks.miles.dashboard: error: Miles is not importable (No module named 'miles'): put a "
        "Miles checkout on PYTHONPATH (PYTHONPATH=/path/to/miles python -m trainer_hooks.miles.dashboard ...)\n"
    )
