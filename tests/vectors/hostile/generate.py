"""Generate the hostile corpus: ``python tests/vectors/hostile/generate.py``.

Each vector is a malformed bundle directory or packed file next to this script, and
``expected.json`` says how it must be refused: the error class, a fragment of the message, and
the level at which a reader must see it (``none``: ``open_bundle(verify="none")``; ``fast`` and
``full``: those verification levels; ``samples``: reading every sample after ``verify="none"``).
Packed vectors must also be refused by ``unpack_bundle``, with the same class and fragment, and
leave nothing behind. ``tests/test_hostile_vectors.py`` reads the table.

Symlinks and FIFOs inside a bundle directory cannot be committed to git; :func:`make_specials`
creates those three vectors at test time (they are in the table with ``"runtime": true``).

Every vector starts from the same small valid bundle (2 samples, 2 screenshots), written by
``write_bundle`` with fixed inputs, and changes one thing. Run this again when the table changes;
the vectors are inputs, so a later change of the writer's bytes does not require it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from bundles import write_bundle
from bundles._format.layout import EXT_MEDIA_REF, EXT_NDARRAY, EXT_TENSOR, EXT_TUPLE

HERE = Path(__file__).resolve().parent
TABLE = HERE / "expected.json"
MEDIA = {
    "a.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
    "b.png": b"\x89PNG\r\n\x1a\n" + bytes(range(255, -1, -1)) * 6,
}
SHARD = "samples/000000.msgpack.zst"

Vector = dict[str, Any]
VECTORS: dict[str, Vector] = {}


def vector(name: str, level: str, error: str, message: str, *, packed: bool = False, runtime: bool = False):
    def register(make: Callable[[Path], None]) -> Callable[[Path], None]:
        VECTORS[name] = {
            "path": name + (".rbundle" if packed else ""),
            "level": level,
            "error": error,
            "message": message,
            "packed": packed,
            "runtime": runtime,
            "make": make,
        }
        return make

    return register


# -- the valid starting point and small editing helpers ---------------------------------------
def base_bundle(dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        paths = []
        for _name, data in MEDIA.items():
            p = run / (hashlib.sha256(data).hexdigest() + ".png")
            p.write_bytes(data)
            paths.append(str(p))
        samples = [
            {"index": i, "prompt": "open the settings", "tokens": [1, 2, 3 + i], "images": paths[: i + 1]}
            for i in range(2)
        ]
        return write_bundle(
            dest, samples, media_roots=[run], meta={"purpose": "hostile vector base"}, link="copy"
        )


def writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())


def put_manifest(path: Path, m: dict[str, Any] | bytes) -> None:
    data = (
        m if isinstance(m, bytes) else (json.dumps(m, sort_keys=True, separators=(",", ":")) + "\n").encode()
    )
    (path / "manifest.json").write_bytes(data)


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = manifest(path)
    change(m)
    put_manifest(path, m)


def media_files(path: Path) -> list[Path]:
    return sorted((path / "media").iterdir())


def put_shard(path: Path, raw: bytes, *, samples: int | None = None, raw_size: int | None = None) -> None:
    data = zstandard.ZstdCompressor(level=3).compress(raw)
    (path / SHARD).write_bytes(data)

    def change(m: dict[str, Any]) -> None:
        m["shards"][0].update(
            size=len(data),
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            raw_size=len(raw) if raw_size is None else raw_size,
        )
        if samples is not None:
            m["shards"][0]["samples"] = samples
            m["sample_count"] = samples

    edit(path, change)


def sample(**extra: Any) -> bytes:
    return msgpack.packb({"index": 0, "prompt": "p", **extra}, use_bin_type=True)


def ref_to(path: Path, i: int, size_delta: int = 0, digest: str | None = None) -> msgpack.ExtType:
    e = manifest(path)["media"][i]
    return msgpack.ExtType(
        EXT_MEDIA_REF, msgpack.packb([digest or e["digest"], e["size"] + size_delta, e["suffix"]])
    )


# -- bundle directories: the manifest ----------------------------------------------------------
@vector(
    "shard-path-traversal",
    "none",
    "UnsafeBundleError",
    "shards[0].path: expected 'samples/NNNNNN.msgpack.zst'",
)
def _(p: Path) -> None:
    edit(p, lambda m: m["shards"][0].update(path="../../etc/passwd"))


@vector(
    "shard-path-absolute",
    "none",
    "UnsafeBundleError",
    "shards[0].path: expected 'samples/NNNNNN.msgpack.zst'",
)
def _(p: Path) -> None:
    edit(p, lambda m: m["shards"][0].update(path="/etc/passwd"))


@vector("media-suffix-traversal", "none", "UnsafeBundleError", "media[0].suffix: expected e.g. '.png'")
def _(p: Path) -> None:
    edit(p, lambda m: m["media"][0].update(suffix="/../../../etc/passwd"))


@vector(
    "media-digest-traversal",
    "none",
    "BundleFormatError",
    "media[0].digest: expected 'sha256:<64 lowercase hex>'",
)
def _(p: Path) -> None:
    edit(p, lambda m: m["media"][0].update(digest="sha256:../../../../etc/passwd"))


@vector("format-version-2", "none", "BundleFormatError", "format_version: expected one of [1], found 2")
def _(p: Path) -> None:
    edit(p, lambda m: m.update(format_version=2))


@vector("manifest-utf8-bom", "none", "BundleFormatError", "starts with a byte order mark")
def _(p: Path) -> None:
    put_manifest(p, b"\xef\xbb\xbf" + (p / "manifest.json").read_bytes())


@vector("manifest-utf16", "none", "BundleFormatError", "not UTF-8")
def _(p: Path) -> None:
    put_manifest(p, (p / "manifest.json").read_text().encode("utf-16"))


@vector("manifest-nan", "none", "BundleFormatError", "NaN is not valid JSON")
def _(p: Path) -> None:
    put_manifest(p, (p / "manifest.json").read_bytes().replace(b'"meta":{', b'"meta":{"x":NaN,'))


@vector("manifest-nested-5000", "none", "BundleFormatError", "nested deeper than 64 levels")
def _(p: Path) -> None:
    put_manifest(
        p,
        (p / "manifest.json")
        .read_bytes()
        .replace(b'"meta":{', b'"meta":{"x":' + b"[" * 5000 + b"]" * 5000 + b","),
    )


@vector(
    "sample-count-2-pow-70",
    "none",
    "BundleFormatError",
    "sample_count: expected an int in [0, 2**63), found 1180591620717411303424",
)
def _(p: Path) -> None:
    edit(p, lambda m: m.update(sample_count=2**70))


@vector("kind-bad-pattern", "none", "BundleFormatError", "kind: expected lowercase letters")
def _(p: Path) -> None:
    edit(p, lambda m: m.update(kind="../debug dump"))


@vector("media-listed-twice", "none", "BundleFormatError", "is listed twice")
def _(p: Path) -> None:
    edit(p, lambda m: m["media"].append(dict(m["media"][0])))


@vector("raw-size-over-cap", "none", "UnsafeBundleError", "shards[0].raw_size: 17179869185 exceeds the cap")
def _(p: Path) -> None:
    edit(p, lambda m: m["shards"][0].update(raw_size=16 * 1024**3 + 1))


@vector("manifest-missing", "none", "BundleNotFoundError", "not a bundle: manifest.json is missing")
def _(p: Path) -> None:
    (p / "manifest.json").unlink()


# -- bundle directories: files against the manifest --------------------------------------------
@vector("media-digest-mismatch", "full", "BundleVerificationError", ": digest: expected sha256:")
def _(p: Path) -> None:
    f = media_files(p)[0]
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF  # same size: only a full verification hashes media
    f.write_bytes(bytes(data))


@vector("media-size-mismatch", "fast", "BundleVerificationError", "size: expected 2056 bytes, found 2057")
def _(p: Path) -> None:
    f = media_files(p)[0]
    f.write_bytes(f.read_bytes() + b"\0")


@vector("media-missing", "fast", "BundleVerificationError", "listed in the manifest but missing")
def _(p: Path) -> None:
    media_files(p)[1].unlink()


@vector("stray-file", "fast", "BundleVerificationError", "notes.txt: file is not listed in the manifest")
def _(p: Path) -> None:
    (p / "media" / "notes.txt").write_text("not part of the bundle")


@vector("stray-directory", "fast", "BundleVerificationError", "extra: unexpected directory")
def _(p: Path) -> None:
    (p / "extra").mkdir()
    (p / "extra" / "x").write_text("x")


@vector(
    "shard-digest-mismatch", "fast", "BundleVerificationError", "000000.msgpack.zst: digest: expected sha256:"
)
def _(p: Path) -> None:
    f = p / SHARD
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


# -- bundle directories: shard contents (digests updated, so they reach the decoder) ----------
@vector("shard-truncated", "samples", "UnsafeBundleError", "raw_size: expected")
def _(p: Path) -> None:
    data = (p / SHARD).read_bytes()[:-9]
    (p / SHARD).write_bytes(data)
    edit(
        p,
        lambda m: m["shards"][0].update(size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest()),
    )


@vector("shard-not-zstd", "samples", "BundleFormatError", "not a valid zstandard stream")
def _(p: Path) -> None:
    data = gzip.compress(b"\x81\xa1x\x01", mtime=0)
    (p / SHARD).write_bytes(data)
    edit(
        p,
        lambda m: m["shards"][0].update(size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest()),
    )


@vector(
    "zstd-bomb",
    "samples",
    "UnsafeBundleError",
    "raw_size: expected 64 decompressed bytes, found more than 64",
)
def _(p: Path) -> None:
    # 150 MB of one sample behind a 64-byte raw_size: readers stop at the declared size.
    put_shard(p, msgpack.packb({"x": b"\0" * 150_000_000}, use_bin_type=True), samples=1, raw_size=64)


@vector("sample-count-disagrees", "samples", "BundleFormatError", "samples: expected 3, found 1")
def _(p: Path) -> None:
    put_shard(p, sample(), samples=3)


@vector("sample-not-a-map", "samples", "BundleFormatError", "samples[0]: expected a map, found list")
def _(p: Path) -> None:
    put_shard(p, msgpack.packb([1, 2, 3]), samples=1)


@vector("reference-not-listed", "samples", "BundleFormatError", "which the manifest does not list")
def _(p: Path) -> None:
    put_shard(p, sample(img=ref_to(p, 0, digest="sha256:" + "0" * 64)), samples=1)


@vector("reference-wrong-size", "samples", "BundleFormatError", "which the manifest does not list")
def _(p: Path) -> None:
    put_shard(p, sample(img=ref_to(p, 0, size_delta=1)), samples=1)


@vector("reference-traversal-suffix", "samples", "BundleFormatError", "suffix")
def _(p: Path) -> None:
    e = manifest(p)["media"][0]
    bad = msgpack.ExtType(EXT_MEDIA_REF, msgpack.packb([e["digest"], e["size"], "/../../etc/passwd"]))
    put_shard(p, sample(img=bad), samples=1)


@vector("unknown-extension", "samples", "BundleFormatError", "unknown msgpack extension type 99")
def _(p: Path) -> None:
    put_shard(p, sample(x=msgpack.ExtType(99, b"payload")), samples=1)


@vector("numpy-object-dtype", "samples", "BundleFormatError", "'|O'")
def _(p: Path) -> None:
    put_shard(p, sample(x=msgpack.ExtType(EXT_NDARRAY, msgpack.packb(["|O", [1]]) + b"\0" * 8)), samples=1)


@vector("torch-dtype-not-allowed", "samples", "BundleFormatError", "_inductor")
def _(p: Path) -> None:
    put_shard(
        p, sample(x=msgpack.ExtType(EXT_TENSOR, msgpack.packb(["_inductor", [1]]) + b"\0" * 2)), samples=1
    )


@vector("array-size-lies", "samples", "BundleFormatError", "needs 8000000000000 bytes, found 8")
def _(p: Path) -> None:
    put_shard(
        p, sample(x=msgpack.ExtType(EXT_NDARRAY, msgpack.packb(["<f8", [10**12]]) + b"\0" * 8)), samples=1
    )


@vector("lists-nested-1000", "samples", "BundleFormatError", "64 levels")
def _(p: Path) -> None:
    put_shard(p, b"\x81\xa1x" + b"\x91" * 1000 + b"\x01", samples=1)


@vector("tuples-of-lists-nested", "samples", "BundleFormatError", "64 levels")
def _(p: Path) -> None:
    inner = b"\x01"
    for _ in range(60):
        inner = b"\x91" * 20 + msgpack.packb(msgpack.ExtType(EXT_TUPLE, b"\x91" + inner))
    put_shard(p, b"\x81\xa1x" + inner, samples=1)


@vector("huge-declared-array", "samples", "UnsafeBundleError", "samples[0]: 4294967295 exceeds max_array_len")
def _(p: Path) -> None:
    put_shard(p, b"\x81\xa1x\xdd\xff\xff\xff\xff" + b"\x01" * 16, samples=1)


# -- bundle directories with links and FIFOs: made at test time (git cannot hold a FIFO) -------
@vector("media-symlink", "fast", "BundleVerificationError", "found a symlink", runtime=True)
def _(p: Path) -> None:
    f = media_files(p)[0]
    f.unlink()
    f.symlink_to("/etc/passwd")


@vector(
    "media-fifo",
    "fast",
    "BundleVerificationError",
    "fifo.png: expected a regular file, found a FIFO",
    runtime=True,
)
def _(p: Path) -> None:
    os.mkfifo(p / "media" / "fifo.png")


@vector(
    "manifest-symlink",
    "none",
    "UnsafeBundleError",
    "manifest.json: expected a regular file, found a symlink",
    runtime=True,
)
def _(p: Path) -> None:
    real = p.parent / f".{p.name}.real-manifest.json"
    real.write_bytes((p / "manifest.json").read_bytes())
    (p / "manifest.json").unlink()
    (p / "manifest.json").symlink_to(real)


# -- packed files ----------------------------------------------------------------------------
def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o444
    return info


def base_members(p: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The members of the base bundle, in packing order."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for name in sorted(
        ["manifest.json", "media", "samples", SHARD] + [f"media/{f.name}" for f in media_files(p)]
    ):
        if name in ("media", "samples"):
            members.append((member(name, tarfile.DIRTYPE), None))
        else:
            members.append((member(name), (p / name).read_bytes()))
    return members


MEDIA_NAME = "media/" + "ab" * 32 + ".png"


def packed(name: str, level: str, error: str, message: str):
    """A packed vector: ``make(base_dir) -> bytes`` of the file."""

    def register(make: Callable[[Path], bytes]) -> Callable[[Path], bytes]:
        def write(out: Path) -> None:
            out.write_bytes(make(BASE[0]))

        vector(name, level, error, message, packed=True)(write)
        return make

    return register


BASE: list[Path] = []  # set by main(): the base bundle directory


def with_extra(p: Path, *extra: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    return tar_bytes(base_members(p) + list(extra), fmt)


@packed("packed-traversal", "none", "UnsafeBundleError", "member '../../etc/cron.d/x': names with '..'")
def _(p: Path) -> bytes:
    return with_extra(p, (member("../../etc/cron.d/x"), b"* * * * * root sh\n"))


@packed("packed-absolute", "none", "UnsafeBundleError", "member '/etc/cron.d/x': absolute names are refused")
def _(p: Path) -> bytes:
    return with_extra(p, (member("/etc/cron.d/x"), b"x"))


@packed("packed-symlink", "none", "UnsafeBundleError", "found a symlink")
def _(p: Path) -> bytes:
    return tar_bytes([(member(MEDIA_NAME, tarfile.SYMTYPE, "/etc/passwd"), None), *base_members(p)])


@packed("packed-hardlink", "none", "UnsafeBundleError", "found a hard link")
def _(p: Path) -> bytes:
    return with_extra(p, (member(MEDIA_NAME, tarfile.LNKTYPE, "/etc/shadow"), None))


@packed("packed-fifo", "none", "UnsafeBundleError", "found a FIFO")
def _(p: Path) -> bytes:
    return with_extra(p, (member(MEDIA_NAME, tarfile.FIFOTYPE), None))


@packed("packed-device", "none", "UnsafeBundleError", "found a character device")
def _(p: Path) -> bytes:
    return with_extra(p, (member(MEDIA_NAME, tarfile.CHRTYPE), None))


@packed("packed-contiguous-file", "none", "UnsafeBundleError", "found a contiguous file")
def _(p: Path) -> bytes:
    return with_extra(p, (member(MEDIA_NAME, tarfile.CONTTYPE), b"x" * 10))


@packed("packed-duplicate", "none", "UnsafeBundleError", "member 'manifest.json': appears twice")
def _(p: Path) -> bytes:
    return with_extra(p, (member("manifest.json"), b'{"format":"rollout-bundle"}'))


@packed("packed-sparse-gnu", "none", "UnsafeBundleError", "found a sparse file")
def _(p: Path) -> bytes:
    # A GNU sparse header ('S') whose map declares 1 GiB of holes behind 512 bytes of data: what
    # made unpack write 1 GiB before.
    data = bytearray(tar_bytes([(member(MEDIA_NAME), b"\0" * 512)]))
    header = data[:512]
    header[156:157] = tarfile.GNUTYPE_SPARSE
    header[386:398] = b"%011o\0" % (1024**3 - 512)  # sparse[0].offset
    header[398:410] = b"%011o\0" % 512  # sparse[0].numbytes
    header[483:495] = b"%011o\0" % (1024**3)  # realsize
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[:512] = header
    return bytes(data[:1024]) + tar_bytes(base_members(p))


@packed("packed-sparse-pax", "none", "UnsafeBundleError", "found a sparse file")
def _(p: Path) -> bytes:
    info = member(MEDIA_NAME)
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": MEDIA_NAME,
        "GNU.sparse.realsize": str(1024**3),
    }
    sparse_map = b"1\n0\n512\n".ljust(512, b"\0") + b"\0" * 512
    return tar_bytes([(info, sparse_map), *base_members(p)], tarfile.PAX_FORMAT)


@packed(
    "packed-media-as-file",
    "none",
    "UnsafeBundleError",
    "member 'media': expected the directory media/, found a regular file",
)
def _(p: Path) -> bytes:
    members = [(member("media"), b"x") if m[0].name == "media" else m for m in base_members(p)]
    return tar_bytes(members)


@packed(
    "packed-manifest-as-directory",
    "none",
    "UnsafeBundleError",
    "member 'manifest.json': expected a regular file, found a directory",
)
def _(p: Path) -> bytes:
    members = [
        (member("manifest.json", tarfile.DIRTYPE), None) if m[0].name == "manifest.json" else m
        for m in base_members(p)
    ]
    return tar_bytes(members)


@packed(
    "packed-unlisted-name",
    "none",
    "UnsafeBundleError",
    "member 'notes.txt': not a name the bundle layout allows",
)
def _(p: Path) -> bytes:
    return with_extra(p, (member("notes.txt"), b"hello"))


@packed("packed-truncated-member", "none", "UnsafeBundleError", "truncated: its 2056 bytes at offset")
def _(p: Path) -> bytes:
    data = tar_bytes(base_members(p))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        first_media = next(m for m in tar.getmembers() if m.name.startswith("media/"))
    return data[: first_media.offset_data + 100]  # inside its data


@packed("packed-no-end-of-archive", "none", "UnsafeBundleError", "end-of-archive blocks are missing")
def _(p: Path) -> bytes:
    data = tar_bytes(base_members(p))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    return data[: last.offset_data + -(-last.size // 512) * 512]


@packed("packed-hidden-second-archive", "none", "UnsafeBundleError", "unexpected data at offset")
def _(p: Path) -> bytes:
    return tar_bytes(base_members(p)) + tar_bytes([(member("../../evil"), b"x")])


@packed("packed-gzip", "none", "UnsafeBundleError", "not a packed bundle (uncompressed tar)")
def _(p: Path) -> bytes:
    return gzip.compress(tar_bytes(base_members(p)), mtime=0)


@packed("packed-garbage", "none", "UnsafeBundleError", "not a packed bundle")
def _(p: Path) -> bytes:
    return bytes((i * 131 + 7) % 256 for i in range(4096))


@packed("packed-huge-pax-header", "none", "UnsafeBundleError", "declares an extended header of")
def _(p: Path) -> bytes:
    info = member(MEDIA_NAME)
    info.pax_headers = {"comment": "x" * 100}
    data = bytearray(tar_bytes([(info, b"x"), *base_members(p)], tarfile.PAX_FORMAT))
    header = data[:512]  # the pax header's own header: claim a 100 MB extended header
    header[124:136] = b"%011o\0" % (100 * 1024 * 1024)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[:512] = header
    return bytes(data)


@packed("packed-manifest-over-cap", "none", "UnsafeBundleError", "exceeds the manifest cap")
def _(p: Path) -> bytes:
    data = bytearray(tar_bytes(base_members(p), tarfile.USTAR_FORMAT))
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        offset = tar.getmember("manifest.json").offset
    header = data[offset : offset + 512]
    header[124:136] = b"%011o\0" % (65 * 1024 * 1024)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header
    return bytes(data)


@packed("packed-no-manifest", "none", "BundleNotFoundError", "the packed file holds no manifest.json")
def _(p: Path) -> bytes:
    return tar_bytes([m for m in base_members(p) if m[0].name != "manifest.json"])


@packed("packed-media-digest-mismatch", "full", "BundleVerificationError", ": digest: expected sha256:")
def _(p: Path) -> bytes:
    members = base_members(p)
    for i, (info, data) in enumerate(members):
        if info.name.startswith("media/") and data is not None:
            bad = bytearray(data)
            bad[10] ^= 0xFF
            members[i] = (info, bytes(bad))
            break
    return tar_bytes(members)


@packed(
    "packed-shard-digest-mismatch", "fast", "BundleVerificationError", "000000.msgpack.zst: digest: expected"
)
def _(p: Path) -> bytes:
    members = base_members(p)
    for i, (info, data) in enumerate(members):
        if info.name == SHARD and data is not None:
            members[i] = (info, data[:-1] + bytes([data[-1] ^ 1]))
    return tar_bytes(members)


# -- driver ----------------------------------------------------------------------------------
def build(name: str, out_dir: Path, base: Path) -> Path:
    """Build one vector into ``out_dir`` (from the base bundle directory ``base``)."""
    v = VECTORS[name]
    target = out_dir / v["path"]
    if target.is_dir():
        writable(target)
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if v["packed"]:
        BASE[:] = [base]
        v["make"](target)
    else:
        shutil.copytree(base, target)
        writable(target)
        v["make"](target)
    return target


def make_specials(out_dir: Path) -> None:
    """The vectors git cannot hold (a symlink or FIFO inside a bundle), built into ``out_dir``."""
    with tempfile.TemporaryDirectory() as tmp:
        base = base_bundle(Path(tmp) / "base")
        for name, v in VECTORS.items():
            if v["runtime"]:
                build(name, out_dir, base)


def table() -> dict[str, dict[str, Any]]:
    return {
        name: {k: v[k] for k in ("path", "level", "error", "message", "packed", "runtime")}
        for name, v in VECTORS.items()
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = base_bundle(Path(tmp) / "base")
        for name, v in VECTORS.items():
            if not v["runtime"]:
                build(name, HERE, base)
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(
        f"{len(VECTORS)} vectors ({sum(v['runtime'] for v in VECTORS.values())} made at test time) -> {HERE}"
    )


if __name__ == "__main__":
    sys.exit(main())
