"""Issue 8, defects 8-13: strict manifests, media_roots, outside paths, pack/unpack overlap, pack
checking what it reads, and filesystem failures reported as BundleIOError naming the file."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import pytest
from helpers import put_media

from bundles import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleIOError,
    BundleVerificationError,
    OutsidePathError,
    OutsidePathWarning,
    UnsafeBundleError,
    open_bundle,
    pack_bundle,
    unpack_bundle,
    write_bundle,
)
from bundles.cli import main


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    paths = [put_media(run, bytes([i]) * 2000) for i in range(3)]
    return write_bundle(tmp_path / "b", [{"i": i, "img": p} for i, p in enumerate(paths)], media_roots=[run])


def _write_manifest(bundle: Path, raw: bytes) -> None:
    m = bundle / "manifest.json"
    os.chmod(m, 0o644)
    m.write_bytes(raw)


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _deep(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


# -- defect 9: the manifest as FORMAT.md says --------------------------------------------------
def _encoded(encoding: str):
    return lambda m: json.dumps(m).encode(encoding)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda m: b"\xef\xbb\xbf" + json.dumps(m).encode(), BundleFormatError, "byte order mark"),
        (_encoded("utf-16"), BundleFormatError, "not UTF-8"),
        (_encoded("utf-16-le"), BundleFormatError, "not UTF-8"),
        (_encoded("utf-32"), BundleFormatError, "not UTF-8"),
        (
            lambda m: json.dumps(m).encode("latin-1").replace(b"debug_dump", b"debug_dump\xe9"),
            BundleFormatError,
            "not UTF-8",
        ),
        (
            lambda m: json.dumps({**m, "meta": {"x": float("inf")}}).encode(),
            BundleFormatError,
            "Infinity is not valid JSON",
        ),
        (
            lambda m: json.dumps({**m, "meta": {"x": float("nan")}}).encode(),
            BundleFormatError,
            "NaN is not valid JSON",
        ),
        (
            lambda m: json.dumps(m).replace('"meta": {', '"meta": {"x": 1e400, ').encode(),
            BundleFormatError,
            "overflows a float64",
        ),
        (
            lambda m: (
                json.dumps({**m, "meta": {"x": 0}})
                .replace('"x": 0', '"x": ' + "[" * 5000 + "]" * 5000)
                .encode()
            ),
            BundleFormatError,
            "nested deeper than 64 levels",
        ),
        (
            lambda m: json.dumps({**m, "meta": {"x": _deep(63)}}).encode(),
            BundleFormatError,
            "nested deeper than 64 levels",
        ),
        (
            lambda m: json.dumps({**m, "kind": "Debug Dump"}).encode(),
            BundleFormatError,
            "kind: expected lowercase",
        ),
        (lambda m: json.dumps({**m, "kind": "../x"}).encode(), BundleFormatError, "kind: expected lowercase"),
        (
            lambda m: json.dumps({**m, "media_references": "12"}).encode(),
            BundleFormatError,
            "media_references: expected an int",
        ),
        (
            lambda m: json.dumps({**m, "media_references": -1}).encode(),
            BundleFormatError,
            "media_references: expected an int",
        ),
        (
            lambda m: json.dumps({**m, "created_by": 5}).encode(),
            BundleFormatError,
            "created_by: expected a string",
        ),
        (
            lambda m: json.dumps({**m, "sample_count": 2**70}).encode(),
            BundleFormatError,
            "sample_count: expected an int in [0, 2**63)",
        ),
        (
            lambda m: json.dumps({**m, "sample_count": True}).encode(),
            BundleFormatError,
            "sample_count: expected an int",
        ),
        (
            lambda m: json.dumps({**m, "shards": [{**m["shards"][0], "samples": 2**70}]}).encode(),
            BundleFormatError,
            "shards[0].samples: expected an int in [0, 2**63)",
        ),
        (
            lambda m: json.dumps(
                {**m, "shards": [{**m["shards"][0], "path": "samples/000001.msgpack.zst"}]}
            ).encode(),
            BundleFormatError,
            "numbered from 0 without gaps",
        ),
        (
            lambda m: json.dumps(
                {**m, "sample_count": 10**6, "shards": [{**m["shards"][0], "samples": 10**6}]}
            ).encode(),
            BundleFormatError,
            "cannot fit in raw_size",
        ),
        (
            lambda m: json.dumps({**m, "media": [{**m["media"][0], "size": 2.5}]}).encode(),
            BundleFormatError,
            "media[0].size",
        ),
        (
            lambda m: json.dumps({**m, "media": {"a": 1}}).encode(),
            BundleFormatError,
            "media: expected a list, found dict",
        ),
    ],
)
def test_manifest_strictness(bundle, make, error, message):
    _write_manifest(bundle, make(_manifest(bundle)))
    with pytest.raises(error) as e:
        open_bundle(bundle, verify="none")
    assert message in str(e.value) and str(bundle / "manifest.json") in str(e.value)
    assert main(["inspect", str(bundle)]) == 1  # the CLI reports it; no traceback


def test_a_manifest_at_the_nesting_limit_is_accepted_and_inspect_works(bundle, capsys):
    m = _manifest(bundle)
    m["meta"] = {"x": _deep(61)}  # manifest (1) > meta (2) > x (3) > 61 lists: 64 levels
    _write_manifest(bundle, json.dumps(m).encode())
    assert len(open_bundle(bundle, verify="fast")) == 3
    assert main(["inspect", str(bundle), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 3


def test_writer_refuses_meta_deeper_than_a_reader_accepts(tmp_path):
    with pytest.raises(BundleError, match=r"meta: .*nested deeper than 64 levels"):
        write_bundle(tmp_path / "b", [], meta={"x": _deep(63)})
    assert not (tmp_path / "b").exists()


# -- defect 10: media_roots ----------------------------------------------------------------------
def test_a_single_path_is_one_media_root(tmp_path):
    run = tmp_path / "run"
    inside = put_media(run, b"inside")
    other = tmp_path / "other.png"
    other.write_bytes(b"other")
    for roots in (str(run), run):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            b = write_bundle(
                tmp_path / f"b{type(roots).__name__}", [{"a": inside, "b": str(other)}], media_roots=roots
            )
        (s,) = open_bundle(b).samples()
        assert s["a"].startswith(str(b / "media")) and s["b"] == str(other)  # "/" did not become a root
        assert [w.category for w in caught] == [OutsidePathWarning]


@pytest.mark.parametrize(
    ("roots", "message"),
    [
        (5, "media_roots: expected a path or an iterable of paths, found int"),
        (None, "media_roots: expected a path or an iterable of paths, found NoneType"),
        (b"/data/run1", "media_roots: expected a path or an iterable of paths, found bytes"),
        ({"/data": 1}, "media_roots: expected a path or an iterable of paths, found dict"),
        (["/data", 7], "media_roots[1]: expected a str or path-like, found int 7"),
        ([""], "media_roots[0]: expected a non-empty str path"),
    ],
)
def test_other_media_roots_are_refused(tmp_path, roots, message):
    with pytest.raises(BundleError) as e:
        write_bundle(tmp_path / "b", [{"x": 1}], media_roots=roots)
    assert message in str(e.value) and str(tmp_path / "b") in str(e.value)
    assert not (tmp_path / "b").exists()


# -- defect 12: absolute paths outside the media roots --------------------------------------------
def _outside_samples(tmp_path: Path) -> tuple[Path, list[dict]]:
    run = tmp_path / "run"
    inside = put_media(run, b"in")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    files = []
    for i in range(5):
        f = elsewhere / f"{i}.png"
        f.write_bytes(bytes([i]))
        files.append(str(f))
    samples = [
        {"img": inside, "old": files[i], "missing": "/no/such/file.png", "note": "/ not a path"}
        for i in range(5)
    ]
    samples[0]["more"] = [files[0], files[1]]
    return run, samples


def test_outside_paths_warn_once_with_the_count_and_first_key_paths(tmp_path):
    run, samples = _outside_samples(tmp_path)
    with pytest.warns(OutsidePathWarning) as record:
        b = write_bundle(tmp_path / "b", samples, media_roots=[run])
    assert len(record) == 1
    msg = str(record[0].message)
    assert msg.startswith(f"{b}: 7 absolute path string(s) to 5 existing file(s) outside the media roots")
    assert "samples[0].old = " in msg and "samples[0].more[0]" in msg and "samples[0].more[1]" in msg
    assert msg.count(" = ") == 3 and "..." in msg and "/no/such/file.png" not in msg
    assert record[0].filename == __file__  # points at the caller's line
    assert [s["old"] for s in open_bundle(b).samples()] == [s["old"] for s in samples]  # kept as they were


def test_outside_paths_error_refuses_naming_the_key_path_and_keep_is_silent(tmp_path):
    run, samples = _outside_samples(tmp_path)
    with pytest.raises(OutsidePathError) as e:
        write_bundle(tmp_path / "b", samples, media_roots=[run], outside_paths="error")
    assert (
        f"{tmp_path / 'b'}: samples[0].old: {samples[0]['old']} names a file outside the media roots"
        in str(e.value)
    )
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "run"]  # nothing written, no staging left
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_bundle(tmp_path / "b", samples, media_roots=[run], outside_paths="keep")
    with pytest.raises(BundleError, match="outside_paths: expected one of keep, warn, error or a callable"):
        write_bundle(tmp_path / "c", samples, outside_paths="silent")


def test_trainer_saves_refuse_another_run_s_media_and_warn_about_other_paths(tmp_path):
    from helpers import trainer_args

    from trainer_hooks import Sample, save_debug_rollout_data, store_media

    mine = trainer_args(
        tmp_path, "run-b", "--save-debug-rollout-data", str(tmp_path / "dumps" / "r_{rollout_id}")
    )
    theirs = trainer_args(tmp_path, "run-a")
    their_ref = store_media(theirs, b"\x89PNG their screenshot")
    my_ref = store_media(mine, b"\x89PNG my screenshot")
    stray = tmp_path / "stray.txt"
    stray.write_text("x")
    ok = Sample(index=0, prompt="p", multimodal_inputs={"images": [my_ref]}, metadata={"log": str(stray)})
    with pytest.warns(OutsidePathWarning, match=r"samples\[0\]\.metadata\.log"):
        save_debug_rollout_data(mine, [ok], 0, evaluation=False)
    bad = Sample(
        index=1, prompt="p", multimodal_inputs={"images": [my_ref]}, metadata={"screen": their_ref.path}
    )
    with pytest.raises(OutsidePathError, match=r"samples\[0\]\.metadata\.screen: .*run-a/"):
        save_debug_rollout_data(mine, [bad], 1, evaluation=False)
    assert not (tmp_path / "dumps" / "r_1").exists()


# -- defect 11: output inside the input --------------------------------------------------------
def test_pack_and_unpack_refuse_an_output_inside_or_around_the_input(bundle, tmp_path):
    before = sorted(os.listdir(bundle))
    for out in (bundle / "x.rbundle", bundle / "media" / "x.rbundle", bundle):
        with pytest.raises(BundleError, match="must not be the input"):
            pack_bundle(bundle, out, overwrite=True)
    assert sorted(os.listdir(bundle)) == before
    open_bundle(bundle, verify="full")
    packed = pack_bundle(bundle, tmp_path / "p.rbundle")
    for out in (packed, tmp_path):
        with pytest.raises(BundleError, match="must not be the input"):
            unpack_bundle(packed, out, overwrite=True)
    open_bundle(packed, verify="full")
    (tmp_path / "d").mkdir()
    with pytest.raises(BundleError, match="output is a directory"):
        pack_bundle(bundle, tmp_path / "d", overwrite=True)
    with pytest.raises(BundleExistsError, match="output exists"):
        pack_bundle(bundle, packed)
    assert main(["pack", str(bundle), "-o", str(bundle / "in.rbundle")]) == 1


# -- defect 13: pack checks what it reads ------------------------------------------------------
def test_pack_refuses_a_file_whose_digest_disagrees(bundle, tmp_path):
    media = sorted((bundle / "media").iterdir())[1]
    data = bytearray(media.read_bytes())
    data[7] ^= 1
    os.chmod(media, 0o644)
    media.write_bytes(bytes(data))  # same size: fast verification cannot see it
    with pytest.raises(BundleVerificationError) as e:
        pack_bundle(bundle, tmp_path / "p.rbundle")
    assert e.value.problems == [
        f"{bundle}/media/{media.name}: digest: expected sha256:{media.name.split('.')[0]}, found "
        + e.value.problems[0].split("found ")[1]
    ]
    assert "not packed" in str(e.value)
    assert [p for p in os.listdir(tmp_path) if p.startswith((".p.rbundle", "p.rbundle"))] == []


# -- defect 8: exceptions that are not BundleError ----------------------------------------------
def test_a_member_named_media_as_a_file_is_refused(tmp_path):
    import io

    evil = tmp_path / "evil.rbundle"
    with tarfile.open(evil, "w") as tar:
        for name, data in (("media", b"x"), ("media/" + "ab" * 32 + ".png", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafeBundleError, match="member 'media': expected the directory media/"):
        unpack_bundle(evil, tmp_path / "out")


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def test_no_space_left_is_a_bundle_io_error_naming_the_file(tmp_path):
    """ENOSPC for real: a 1 MiB tmpfs (needs root and mount; skipped otherwise)."""
    small = tmp_path / "small"
    if not _tmpfs(small, "1m"):
        pytest.skip("needs root and `mount -t tmpfs` to fill a real filesystem")
    try:
        run = tmp_path / "run"
        big = put_media(run, os.urandom(3 * 1024 * 1024))
        with pytest.raises(BundleIOError) as e:
            write_bundle(small / "b", [{"img": big}], media_roots=[run], link="copy")
        assert e.value.errno == errno.ENOSPC and isinstance(e.value.__cause__, OSError)
        assert str(e.value).startswith(f"{small / 'b'}: cannot write the bundle: [Errno 28]")
        assert os.listdir(small) == []  # no bundle, no staging
        ok = write_bundle(tmp_path / "ok", [{"img": big}], media_roots=[run])
        with pytest.raises(BundleIOError) as e:
            pack_bundle(ok, small / "ok.rbundle")
        assert e.value.errno == errno.ENOSPC and str(small / "ok.rbundle") in str(e.value)
        assert os.listdir(small) == []
        with pytest.raises(BundleIOError, match="rehydrate into"):
            open_bundle(ok).rehydrate(small / "media", link="copy")
        assert [p for p in os.listdir(small / "media") if not p.startswith(".")] == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_file_too_large_is_a_bundle_io_error(tmp_path):
    """EFBIG for real: RLIMIT_FSIZE in a subprocess that ignores SIGXFSZ."""
    run = tmp_path / "run"
    big = put_media(run, os.urandom(400_000))
    script = textwrap.dedent(
        f"""
        import json, resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        from bundles import BundleIOError, write_bundle
        try:
            write_bundle({str(tmp_path / "b")!r}, [{{"img": {big!r}}}], media_roots=[{str(run)!r}], link="copy")
        except BundleIOError as e:
            print(json.dumps({{"errno": e.errno, "msg": str(e), "cause": type(e.__cause__).__name__}}))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, env=os.environ
    )
    assert r.returncode == 0 and r.stdout, r.stderr
    out = json.loads(r.stdout)
    assert out["errno"] == errno.EFBIG and out["cause"] == "OSError"
    assert out["msg"].startswith(f"{tmp_path / 'b'}: cannot write the bundle: [Errno 27] File too large")
    assert sorted(os.listdir(tmp_path)) == ["run"]


# -- review: write arguments and unpack errors name what the user gave ---------------------------
def test_meta_that_json_would_change_is_refused_naming_its_key_path(tmp_path):
    for meta, where in (
        ({"run": {"steps": {3: "x"}}}, "meta.run.steps: keys must be strings, found 3"),
        ({"a": [1, float("inf")]}, "meta.a[1]: expected a finite number, found inf"),
        ({"a": {"b": object()}}, "meta.a.b: expected a JSON-compatible value, found builtins.object"),
    ):
        with pytest.raises(BundleError) as e:
            write_bundle(tmp_path / "b", [{}], meta=meta)
        assert str(e.value).startswith(f"{tmp_path / 'b'}: {where}")
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(BundleError, match=r"meta(\.self)+: nested deeper than 64 levels"):
        write_bundle(tmp_path / "b", [{}], meta=cyclic)
    assert not (tmp_path / "b").exists()


def test_samples_that_are_not_an_iterable_of_samples_are_refused(tmp_path):
    for samples in (5, {"i": 1}, "abc"):
        with pytest.raises(BundleError, match=r"b: samples: expected an iterable of sample dicts"):
            write_bundle(tmp_path / "b", samples)  # type: ignore[arg-type]
    assert not (tmp_path / "b").exists()


def test_an_outside_paths_callable_must_answer_keep_warn_or_error(tmp_path):
    run, samples = _outside_samples(tmp_path)
    with pytest.raises(BundleError) as e:
        write_bundle(tmp_path / "b", samples, media_roots=[run], outside_paths=lambda p: True)  # type: ignore[arg-type,return-value]
    assert f"samples[0].old: outside_paths({samples[0]['old']!r}) returned True; expected one of keep" in str(
        e.value
    )
    assert not (tmp_path / "b").exists()


def test_unpack_verification_problems_name_the_packed_file(bundle, tmp_path):
    # A well-formed packed file whose media member disagrees with its digest: the problems name
    # the member inside the packed file, not the staging directory the unpack was writing.
    media = sorted((bundle / "media").iterdir())[0]
    evil = tmp_path / "evil.rbundle"
    with tarfile.open(evil, "w", format=tarfile.USTAR_FORMAT) as tar:
        for path in sorted(bundle.rglob("*")):
            info = tar.gettarinfo(str(path), str(path.relative_to(bundle)))
            if path.is_dir():
                tar.addfile(info)
            else:
                data = b"\0" * info.size if path == media else path.read_bytes()
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleVerificationError) as e:
        unpack_bundle(evil, tmp_path / "out")
    assert e.value.path == evil
    assert any(p.startswith(f"{evil}/media/{media.name}: ") for p in e.value.problems), e.value.problems
    assert ".staging." not in str(e.value)
    assert not (tmp_path / "out").exists()
