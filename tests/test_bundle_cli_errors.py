"""Errors of the bundle commands that said the wrong thing (issue 16 item 9, bundles' parts):
``show --keys typo`` printed ``{}`` and exited 0; ``inspect old.pt`` gave no ``import-dump``
hint; permission denied read as "missing"; temporary file names leaked into messages."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from helpers import put_media

from bundles import BundleIOError, write_bundle
from bundles.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    samples = [{"index": 0, "reward": 1.0}, {"index": 1, "reward": 0.5, "late": "only here"}]
    return write_bundle(tmp_path / "b", samples, kind="debug_dump", meta={})


# -- show --keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["rewrad", "reward,rewrad", "reward.value"])
def test_show_keys_names_a_key_path_found_in_no_sample(capsys, bundle, keys):
    rc, out, err = _run(capsys, "show", str(bundle), "--keys", keys)
    assert rc == 2 and out == ""
    bad = [k for k in keys.split(",") if k != "reward"]
    assert f"--keys: {bad[0]!r}: no such key path in any shown sample" in err
    assert "top-level keys: index, late, reward" in err


def test_show_keys_found_in_a_later_sample_only_is_not_an_error(capsys, bundle):
    rc, out, err = _run(capsys, "show", str(bundle), "--keys", "late,reward")
    assert rc == 0 and err == ""
    shown = json.loads(out)
    assert shown == [
        {"position": 0, "sample": {"reward": 1.0}},
        {"position": 1, "sample": {"late": "only here", "reward": 0.5}},
    ]


def test_show_keys_on_chosen_samples_only_looks_at_those(capsys, bundle):
    rc, out, err = _run(capsys, "show", str(bundle), "0", "--keys", "late")
    assert rc == 2 and out == "" and "'late': no such key path" in err


# -- inspect old.pt --------------------------------------------------------------------------------


def test_inspect_of_a_torch_save_file_hints_at_import_dump(capsys, tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch to write a real torch.save file")
    for name, legacy in (("old.pt", False), ("older.pt", True)):
        path = tmp_path / name
        torch.save({"samples": [{"index": 0}]}, path, _use_new_zipfile_serialization=not legacy)
        rc, out, err = _run(capsys, "inspect", str(path))
        assert rc == 1 and out == ""
        assert "not a packed bundle" in err
        assert f"convert it with `rollout-bundle import-dump {path} -o {path.with_suffix('')}.rbundle`" in err


def test_a_pickle_file_gets_the_hint_and_an_unrelated_zip_does_not(capsys, tmp_path):
    pkl = tmp_path / "dump.pkl"
    pkl.write_bytes(pickle.dumps({"samples": []}, protocol=2))
    rc, _, err = _run(capsys, "inspect", str(pkl))
    assert rc == 1 and "import-dump" in err
    other = tmp_path / "photos.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("a.txt", "hi")
    rc, _, err = _run(capsys, "inspect", str(other))
    assert rc == 1 and "not a packed bundle" in err and "import-dump" not in err


# -- permission denied is not "missing" ---------------------------------------------------------------


@pytest.fixture
def shared_dir():
    """A directory another user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="bundles-perm-", dir="/tmp"))
    path.chmod(0o777)  # the unprivileged writer creates its bundle here
    yield path
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path)


def _as_unprivileged(code: str) -> dict:
    """Run ``code`` in a subprocess that cannot bypass permissions: as root it drops to nobody
    after its imports (root reads any file whatever its mode)."""
    script = textwrap.dedent(
        """
        import json, os, sys
        import bundles, bundles.cli, bundles.support, PIL.Image, msgpack, zstandard  # noqa: F401
        # What argparse and friends import lazily: nobody cannot read a stdlib under /root (pyenv).
        import argparse, gettext, locale, encodings.idna, tarfile  # noqa: F401, E401
        if os.geteuid() == 0:
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            except OSError as e:
                print(json.dumps({"skip": f"cannot drop root privileges: {e}"}))
                sys.exit(0)
        """
    ) + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


def test_verify_reports_an_unlistable_directory_not_missing_files(shared_dir):
    run = shared_dir / "run"
    paths = [put_media(run, b"\x89PNG image %d" % i) for i in range(3)]
    b = write_bundle(shared_dir / "b", [{"images": paths}], media_roots=[run], kind="debug_dump", meta={})
    (b / "media").chmod(0o311)  # files reachable, the directory not listable
    out = _as_unprivileged(
        f"""
        import contextlib, io
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = bundles.cli.main(["verify", {str(b)!r}])
        print(json.dumps({{"rc": rc, "err": err.getvalue()}}))
        """
    )
    assert out["rc"] == 1
    assert f"{b}/media: cannot list the directory: Permission denied" in out["err"]
    assert "missing" not in out["err"]


def test_a_media_root_that_cannot_be_searched_is_an_io_error_not_missing_media(shared_dir):
    root = shared_dir / "private-run"
    put_media(root, b"\x89PNG private")
    root.chmod(0o000)
    out = _as_unprivileged(
        f"""
        from bundles import BundleError, MediaRef
        ref = MediaRef.from_bytes(b"\\x89PNG private")  # no path: looked up in the media roots
        try:
            bundles.write_bundle({str(shared_dir / "b")!r}, [{{"image": ref}}], media_roots=[{str(root)!r}],
                                 kind="debug_dump", meta={{}})
            print(json.dumps({{"raised": None}}))
        except BundleError as e:
            print(json.dumps({{"raised": type(e).__name__, "errno": e.errno, "msg": str(e)}}))
        """
    )
    assert out["raised"] == "BundleIOError" and out["errno"] == errno.EACCES
    assert "Permission denied" in out["msg"] and "no file" not in out["msg"], out


# -- temporary names never reach a message ------------------------------------------------------------


# A name that fits (240 bytes) whose staging or temporary name does not (NAME_MAX is 255): the
# filesystem's error names the temporary name, which the user never typed.
LONG = "d" * 240


def test_a_failed_write_names_the_bundle_not_its_staging_directory(tmp_path, capsys):
    dest = tmp_path / LONG
    with pytest.raises(BundleIOError) as e:
        write_bundle(dest, [{"x": 1}], kind="t", meta={})
    assert e.value.errno == errno.ENAMETOOLONG
    assert str(e.value) == f"{dest}: cannot write the bundle: [Errno 36] File name too long: '{dest}'"
    assert e.value.filename == str(dest)
    assert os.listdir(tmp_path) == []


def test_a_failed_pack_names_the_output_not_its_temporary_file(tmp_path, capsys, bundle):
    out_file = tmp_path / (LONG + ".rbundle")
    rc, out, err = _run(capsys, "pack", str(bundle), "-o", str(out_file))
    assert rc == 1 and out == ""
    assert ".staging." not in err
    assert err == (
        f"rollout-bundle pack: error: {out_file}: cannot write the packed bundle: [Errno 36] File name "
        f"too long: '{out_file}'\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["b"]  # no temporary file left
