"""The safety core's answers pinned exactly: tests written for the mutants that survived
``make mutants-safety`` (issue 36, "Checks"; docs/TESTING.md "Mutation testing").

The bundle proof (:mod:`bundles._local.proof`, ``examine_prefix``), the deletion primitive
(:mod:`bundles._local.commit`, ``remove_on_store``) and the publish path (:mod:`bundles._store.verify`,
``upload_bundle``) were mostly tested by what they do to a user's files; a mutant that changed a
reason, a flag of a refusal (``damaged``, ``empty``) or a count in ``UploadStats`` went unseen.
Here each answer is compared whole: the :class:`NotProven` (where, reason, damaged, empty), the
message of a refusal, the objects left on a real S3 server (moto on 127.0.0.1). Every test that
deletes plants a user's file and checks it survives.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

from bundles import BundleFormatError, BundleNotFoundError, is_bundle, write_bundle
from bundles._errors import UnsafeBundleError
from bundles._format.layout import MAX_MANIFEST_BYTES
from bundles._format.limits import MAX_POINTER_BYTES
from bundles._local.proof import (
    DAMAGED_HINT,
    NotProven,
    Proof,
    claims_format,
    examine_directory,
    judge_manifest,
    removable_names,
)
from bundles._local.sources import layout_name_ok
from bundles._store.client import get_store
from bundles._store.pointer import Pointer, _BundlePrefix, examine_prefix, parse_pointer
from bundles._urls import StoreURL
from bundles.support import on_fault_point

WEB = b'{"name": "My App", "start_url": "/"}\n'


def local_bundle(tmp_path: Path, name: str = "b", tag: str = "a") -> Path:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    return Path(
        write_bundle(tmp_path / name, [{"i": i, "image": p} for i, p in enumerate(paths)], media_roots=[run])
    )


# -- the proof: bundles/_local/proof.py ---------------------------------------------------------------
def test_a_proven_directory_names_its_members_shards_first(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    found = examine_directory(b)
    assert isinstance(found, Proof)
    media = sorted(os.listdir(b / "media"))
    assert found.members() == ["samples/000000.msgpack.zst", *(f"media/{m}" for m in media)]
    assert (found.where, found.generation, found.shared_media, found.etag) == (str(b), None, False, None)
    assert examine_directory(str(b) + "/") == found  # the same directory, by any spelling


def test_examine_directory_says_exactly_why_a_directory_is_no_bundle(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    staging = tmp_path / ".b.staging.host.1a2b.4026.77.0f"
    staging.mkdir()
    link = tmp_path / "link"
    link.symlink_to(b)
    plain = tmp_path / "file"
    plain.write_text("mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    gone = tmp_path / "gone"
    assert examine_directory(staging) == NotProven(
        str(staging), f"{staging}: a staging or retired directory of a writer, not a bundle"
    )
    assert examine_directory(link) == NotProven(str(link), f"{link}: a symlink, not a bundle directory")
    assert examine_directory(gone) == NotProven(
        str(gone), f"{gone}: no bundle here (path does not exist)", empty=True
    )
    assert examine_directory(plain) == NotProven(str(plain), f"{plain}: not a directory")
    assert examine_directory(plain / "x") == NotProven(str(plain / "x"), f"{plain / 'x'}: not a directory")
    assert examine_directory(empty) == NotProven(
        str(empty), f"{empty}: not a bundle (manifest.json is missing)", empty=True
    )
    assert examine_directory(other) == NotProven(
        str(other), f"{other}: not a bundle (manifest.json is missing)"
    )
    assert (other / "notes.txt").read_text() == "mine\n" and b.is_dir()


@pytest.mark.parametrize("kind", ["dir", "link", "fifo"])
def test_a_manifest_that_is_not_a_regular_file_is_no_bundle(tmp_path: Path, kind: str) -> None:
    b = local_bundle(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    m = d / "manifest.json"
    if kind == "dir":
        m.mkdir()
    elif kind == "link":
        m.symlink_to(b / "manifest.json")  # a valid manifest, but reached through a link
    else:
        os.mkfifo(m)
    assert examine_directory(d) == NotProven(str(d), f"{m}: not a regular file: not a bundle")
    assert not is_bundle(d)  # a directory named manifest.json raised IsADirectoryError here


@pytest.mark.parametrize(
    ("raw", "damaged", "reason"),
    [
        (WEB, False, "not a rollout-bundle manifest (format: expected 'rollout-bundle', found None)"),
        (
            b"not json",
            False,
            "not a rollout-bundle manifest (not valid JSON: Expecting value: line 1 column 1 (char 0))",
        ),
        (
            b'{"format" :  "rollout-bundle"}',
            True,
            "format_version: expected one of [1], found None; a newer rollout-bundles may read it",
        ),
    ],
)
def test_a_manifest_that_does_not_validate_is_judged_damaged_only_when_it_claims_the_format(
    tmp_path: Path, raw: bytes, damaged: bool, reason: str
) -> None:
    d = tmp_path / "my site"  # a space in the path: the reason is cut at ": ", not at a blank
    d.mkdir()
    (d / "manifest.json").write_bytes(raw)
    where = f"{d}/manifest.json"
    assert examine_directory(d) == NotProven(str(d), f"{where}: {reason}", damaged=damaged)
    assert judge_manifest(raw, where) == NotProven(where, f"{where}: {reason}", damaged=damaged)
    found = examine_directory(d)
    assert isinstance(found, NotProven) and found.why == f"{where}: {reason}"  # names the manifest, not d
    with pytest.raises((BundleFormatError, BundleNotFoundError)):
        removable_names(examine_directory(d), damaged=False)
    assert (d / "manifest.json").read_bytes() == raw


@pytest.mark.parametrize("claim", [False, True])
def test_a_manifest_over_the_cap_is_no_bundle_and_damaged_when_it_claims_the_format(
    tmp_path: Path, claim: bool
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    head = b'{"format": "rollout-bundle", "x": "' if claim else b'{"x": "'
    with open(d / "manifest.json", "wb") as f:
        f.write(head)
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: one byte over the cap
    where = f"{d}/manifest.json"
    assert examine_directory(d) == NotProven(
        str(d), f"{where}: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap", damaged=claim
    )
    with open(d / "manifest.json", "r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES)  # at the cap: read whole, judged by what it holds
    at_cap = examine_directory(d)
    assert (
        isinstance(at_cap, NotProven)
        and at_cap.reason != f"{where}: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap"
    )


def test_claims_format_is_the_formats_name_as_format_and_nothing_else() -> None:
    assert claims_format(b'{"format":"rollout-bundle"}')
    assert claims_format(b'{"a": 1, "format" :\n "rollout-bundle-pointer"}')
    assert not claims_format(b'{"format": "rollout-bundles"}')
    assert not claims_format(b'{"format": "rollout"}')
    assert not claims_format(b'{"name": "rollout-bundle"}')
    assert not claims_format(WEB)


def test_not_proven_why_drops_only_its_own_location() -> None:
    assert NotProven("/x", "/x: gone").why == "gone"
    assert NotProven("/x", "/y: gone").why == "/y: gone"
    assert NotProven("/x", "/x:gone").why == "/x:gone"
    assert NotProven("/x", "why").why == "why"
    assert (NotProven("/x", "r").damaged, NotProven("/x", "r").empty) == (False, False)


def test_removable_names_allows_the_listed_members_or_the_layout_or_refuses_by_reason(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    proof = examine_directory(b)
    assert isinstance(proof, Proof)
    ours = removable_names(proof, damaged=False)
    assert [n for n in proof.members() if ours(n)] == proof.members()
    assert not ours("manifest.json") and not ours("samples/000001.msgpack.zst") and not ours("notes.txt")
    assert removable_names(proof, damaged=True)("samples/000000.msgpack.zst")
    damaged = NotProven("/d", "/d/manifest.json: broken", damaged=True)
    assert removable_names(damaged, damaged=True) is layout_name_ok
    with pytest.raises(BundleFormatError) as e:
        removable_names(damaged, damaged=False)
    assert str(e.value) == f"/d/manifest.json: broken: a damaged bundle, not removed; {DAMAGED_HINT}"
    with pytest.raises(BundleNotFoundError) as empty:
        removable_names(NotProven("/e", "/e: nothing", empty=True), damaged=True)
    assert str(empty.value) == "/e: nothing"
    with pytest.raises(BundleNotFoundError) as other:
        removable_names(NotProven("/f", "/f: not a bundle"), damaged=True)
    assert str(other.value) == "/f: not a bundle; refusing to remove it"
    assert DAMAGED_HINT == (
        "`rollout-bundle rm --damaged` (remove_bundle(..., damaged=True)) removes only the names the format "
        "writes (manifest.json, samples/NNNNNN.msgpack.zst, media/<64 hex><suffix>)"
    )


# -- the pointer: bundles/_store/pointer.py ----------------------------------------------------
GEN = "g20260101T000000000000Z-0123456789ab"
DIGEST = "sha256:" + "a" * 64


def test_a_pointer_is_written_in_one_canonical_form_and_read_back_whole() -> None:
    shared = Pointer(GEN, 12, DIGEST, True, "e1")
    assert shared.to_bytes() == (
        b'{"format":"rollout-bundle-pointer","generation":"'
        + GEN.encode()
        + b'","manifest":{"digest":"'
        + DIGEST.encode()
        + b'","size":12},"media":"../.media","pointer_version":1}\n'
    )
    own = Pointer(GEN, 12, DIGEST, False)
    assert own.to_bytes().endswith(b'"media":"media","pointer_version":1}\n')
    assert parse_pointer(shared.to_bytes(), "w", "e2") == Pointer(GEN, 12, DIGEST, True, "e2")
    assert parse_pointer(own.to_bytes(), "w") == Pointer(GEN, 12, DIGEST, False, None)
    assert parse_pointer(Pointer(GEN, MAX_MANIFEST_BYTES, DIGEST, False).to_bytes(), "w").manifest_size == (
        MAX_MANIFEST_BYTES
    )
    assert parse_pointer(Pointer(GEN, 1, DIGEST, False).to_bytes(), "w").manifest_size == 1


def _pointer_body(**change: Any) -> bytes:
    body = json.loads(Pointer(GEN, 12, DIGEST, False).to_bytes())
    for key, value in change.items():
        if value is _DROP:
            body.pop(key)
        else:
            body[key] = value
    return json.dumps(body).encode()


_DROP = object()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"\xff",
            "not a JSON pointer: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
        ),
        (
            b"{",
            "not a JSON pointer: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b"[1]", "format: expected 'rollout-bundle-pointer'"),
        (_pointer_body(format="rollout-bundle"), "format: expected 'rollout-bundle-pointer'"),
        (_pointer_body(pointer_version=2), "pointer_version: expected 1, found 2"),
        (_pointer_body(pointer_version=_DROP), "pointer_version: expected 1, found None"),
        (_pointer_body(generation="g1"), "generation: expected g<time>-<hex>, found 'g1'"),
        (_pointer_body(generation=GEN + "0"), f"generation: expected g<time>-<hex>, found '{GEN}0'"),
        (_pointer_body(generation=None), "generation: expected g<time>-<hex>, found None"),
        (_pointer_body(manifest=[]), f"manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found None"),
        (
            _pointer_body(manifest={"digest": DIGEST, "size": 0}),
            f"manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found 0",
        ),
        (
            _pointer_body(manifest={"digest": DIGEST, "size": MAX_MANIFEST_BYTES + 1}),
            f"manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found {MAX_MANIFEST_BYTES + 1}",
        ),
        (
            _pointer_body(manifest={"digest": DIGEST, "size": True}),
            f"manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found True",
        ),
        (
            _pointer_body(manifest={"digest": DIGEST, "size": "12"}),
            f"manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found '12'",
        ),
        (_pointer_body(manifest={"size": 12}), "manifest.digest: expected sha256:<64 hex>, found None"),
        (
            _pointer_body(manifest={"digest": DIGEST.upper(), "size": 12}),
            f"manifest.digest: expected sha256:<64 hex>, found '{DIGEST.upper()}'",
        ),
        (
            _pointer_body(manifest={"digest": DIGEST + "0", "size": 12}),
            f"manifest.digest: expected sha256:<64 hex>, found '{DIGEST}0'",
        ),
        (_pointer_body(media="../other"), "media: expected 'media' or '../.media', found '../other'"),
        (_pointer_body(media=_DROP), "media: expected 'media' or '../.media', found None"),
    ],
)
def test_every_field_of_an_untrusted_pointer_is_checked_and_named(raw: bytes, message: str) -> None:
    with pytest.raises(BundleFormatError) as e:
        parse_pointer(raw, "s3://b/u/bundle.json")
    assert str(e.value) == f"s3://b/u/bundle.json: {message}"


def test_a_pointer_over_its_cap_is_refused_unparsed() -> None:
    raw = _pointer_body(pad="x" * MAX_POINTER_BYTES)
    with pytest.raises(UnsafeBundleError) as e:
        parse_pointer(raw, "w")
    assert str(e.value) == f"w: {len(raw)} bytes exceeds the pointer cap of {MAX_POINTER_BYTES}"
    at_cap = _pointer_body(pad="x" * (MAX_POINTER_BYTES - len(_pointer_body(pad=""))))
    assert len(at_cap) == MAX_POINTER_BYTES and parse_pointer(at_cap, "w").generation == GEN


def test_a_bundle_prefix_keys_its_names_by_generation_and_media_place() -> None:
    url = StoreURL("s3://bkt/run/b")
    own = _BundlePrefix(url, None, Pointer(GEN, 1, DIGEST, False))  # type: ignore[arg-type]
    pooled = _BundlePrefix(url, None, Pointer(GEN, 1, DIGEST, True))  # type: ignore[arg-type]
    plain = _BundlePrefix(url, None, Pointer(None, None, None, False))  # type: ignore[arg-type]
    assert (own.media_prefix, pooled.media_prefix) == ("run/b/media", "run/.media")
    assert own.key("manifest.json") == f"run/b/{GEN}/manifest.json"
    assert own.key("samples/000000.msgpack.zst") == f"run/b/{GEN}/samples/000000.msgpack.zst"
    assert (own.key("media/x.png"), pooled.key("media/x.png")) == ("run/b/media/x.png", "run/.media/x.png")
    assert (plain.key("manifest.json"), plain.key("media/x.png")) == (
        "run/b/manifest.json",
        "run/b/media/x.png",
    )
    assert own.key("mediax/y") == f"run/b/{GEN}/mediax/y"


# -- the proof on a store: examine_prefix, on moto at 127.0.0.1 ----------------------------------
@pytest.fixture
def moto(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    moto_s3.current = moto_s3.bucket()
    return moto_s3


def raw_store(server: Any) -> Any:
    """The test's own client (not the code under test's), to seed and look at the bucket."""
    from obstore.store import S3Store

    return S3Store(server.current, **server.options(), client_options={"allow_http": True})


def contents(server: Any) -> dict[str, bytes]:
    import obstore

    store = raw_store(server)
    keys = sorted(m["path"] for batch in obstore.list(store) for m in batch)
    return {k: bytes(obstore.get(store, k).bytes()) for k in keys}


def put(server: Any, key: str, data: bytes) -> None:
    import obstore

    obstore.put(raw_store(server), key, data)


def _plain_copy(server: Any, tmp_path: Path) -> None:
    """A bundle written locally and copied verbatim to ``r/b`` (no pointer: a plain copy)."""
    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    for p in sorted(src.rglob("*")):
        if p.is_file():
            put(server, f"r/b/{p.relative_to(src)}", p.read_bytes())


def examine(url: str) -> Proof | NotProven:
    u = StoreURL(url)
    return examine_prefix(get_store(u, None), u)


def store_bundle(server: Any, tmp_path: Path, key: str, tag: str, **kw: Any) -> str:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    url = f"s3://{server.current}/{key}"
    write_bundle(url, [{"i": i, "image": p} for i, p in enumerate(paths)], media_roots=[run], **kw)
    return url


def test_examine_prefix_proves_a_pointer_bundle_with_what_it_read(moto: Any, tmp_path: Path) -> None:
    import obstore

    for key, shared in (("r/own", False), ("r/pooled", True)):
        url = store_bundle(moto, tmp_path, key, key, shared_media=shared)
        pointer = json.loads(contents(moto)[f"{key}/bundle.json"])
        found = examine(url)
        assert isinstance(found, Proof)
        etag = obstore.head(raw_store(moto), f"{key}/bundle.json")["e_tag"]
        assert (found.where, found.generation, found.shared_media, found.etag) == (
            url,
            pointer["generation"],
            shared,
            etag,
        )
        assert found.manifest.sample_count == 2 and len(found.members()) == 3
        gen_url = f"{url}/{pointer['generation']}"
        assert examine(gen_url) == NotProven(
            gen_url, f"{gen_url}: a generation of the bundle {url}, not a bundle (it is part of that one)"
        )


def test_examine_prefix_says_exactly_why_a_prefix_is_no_bundle(moto: Any, tmp_path: Path) -> None:
    url = store_bundle(moto, tmp_path, "r/b", "b")
    objects = contents(moto)
    pointer = objects["r/b/bundle.json"]
    gen = json.loads(pointer)["generation"]
    manifest = objects[f"r/b/{gen}/manifest.json"]
    base = f"s3://{moto.current}"

    put(moto, "big/bundle.json", b" " * (MAX_POINTER_BYTES + 1))
    put(moto, "cfg/bundle.json", b'{"theme": "dark"}\n')
    put(moto, "claim/bundle.json", b'{"format": "rollout-bundle-pointer"}')
    put(moto, "nogen/bundle.json", pointer)  # names a generation that is not under nogen/
    put(moto, "other/bundle.json", pointer)
    put(moto, f"other/{gen}/manifest.json", manifest[:-2] + b" }")  # same size, other digest
    web_ptr = Pointer(gen, len(WEB), "sha256:" + hashlib.sha256(WEB).hexdigest(), False).to_bytes()
    put(moto, "web/bundle.json", web_ptr)
    put(moto, f"web/{gen}/manifest.json", WEB)
    put(moto, "plainweb/manifest.json", WEB)
    put(moto, "plaindmg/manifest.json", b'{"format": "rollout-bundle"}')
    put(moto, "plain/manifest.json", manifest)
    put(moto, "empty/notes.txt", b"mine\n")
    before = contents(moto)

    assert examine(f"{base}/big") == NotProven(
        f"{base}/big",
        f"{base}/big/bundle.json: {MAX_POINTER_BYTES + 1} bytes exceeds the pointer cap of {MAX_POINTER_BYTES} "
        f"bytes: {base}/big/bundle.json is not a bundle pointer",
    )
    assert examine(f"{base}/cfg") == NotProven(
        f"{base}/cfg",
        f"{base}/cfg/bundle.json: holds a file that is not a bundle pointer (format: expected 'rollout-bundle-pointer')",
    )
    assert examine(f"{base}/claim") == NotProven(
        f"{base}/claim", f"{base}/claim/bundle.json: pointer_version: expected 1, found None", damaged=True
    )
    assert examine(f"{base}/nogen") == NotProven(
        f"{base}/nogen",
        f"{base}/nogen/{gen}/manifest.json: the manifest {base}/nogen/bundle.json names is missing",
        damaged=True,
    )
    assert examine(f"{base}/other") == NotProven(
        f"{base}/other",
        f"{base}/other/{gen}/manifest.json: not the manifest {base}/other/bundle.json names (size or digest differ)",
        damaged=True,
    )
    web_reason = "not a rollout-bundle manifest (format: expected 'rollout-bundle', found None)"
    assert examine(f"{base}/web") == NotProven(
        f"{base}/web", f"{base}/web/{gen}/manifest.json: {web_reason}", damaged=True
    )
    assert examine(f"{base}/plainweb") == NotProven(
        f"{base}/plainweb", f"{base}/plainweb/manifest.json: {web_reason}"
    )
    assert examine(f"{base}/plaindmg") == NotProven(
        f"{base}/plaindmg",
        f"{base}/plaindmg/manifest.json: format_version: expected one of [1], found None; a newer rollout-bundles may read it",
        damaged=True,
    )
    plain = examine(f"{base}/plain")
    assert isinstance(plain, Proof)
    assert (plain.where, plain.generation, plain.shared_media, plain.etag) == (
        f"{base}/plain",
        None,
        False,
        None,
    )
    assert plain.members() == examine(url).members()  # type: ignore[union-attr]
    for name in ("empty", "nothing"):
        assert examine(f"{base}/{name}") == NotProven(
            f"{base}/{name}", f"{base}/{name}: no bundle here (no bundle.json or manifest.json)", empty=True
        )
    assert contents(moto) == before  # a proof reads, never writes


# -- the commit: bundles/_local/commit.py --------------------------------------------------------------
def _tags(path: Path) -> list[str]:
    from bundles import open_bundle

    with open_bundle(path, verify="full") as b:
        return [s["tag"] for s in b]


def tagged_bundle(tmp_path: Path, dest: Path, tag: str, overwrite: bool = False) -> Path:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    samples = [{"i": i, "image": p, "tag": tag} for i, p in enumerate(paths)]
    return Path(write_bundle(dest, samples, media_roots=[run], overwrite=overwrite))


def _siblings(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if not n.startswith("run-"))


def test_an_overwrite_without_rename_exchange_retires_the_old_bundle_then_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem without RENAME_EXCHANGE (as the crash-injection suite makes one): the old
    bundle is renamed aside, the new one into place, the old one removed; between the renames
    the destination is missing and the retired directory is the old bundle, whole."""
    from bundles._local import commit as _commit

    dest = tagged_bundle(tmp_path, tmp_path / "b", "old")
    (tmp_path / "notes.txt").write_text("mine\n")
    old = (dest / "manifest.json").read_bytes()
    monkeypatch.setattr(_commit, "exchange", lambda a, b: False)
    seen: list[tuple[bool, list[bytes]]] = []

    def between(where: Path) -> None:
        retired = [n for n in os.listdir(tmp_path) if n.startswith(".b.retired.")]
        seen.append(
            (os.path.lexists(where), [(tmp_path / r / "manifest.json").read_bytes() for r in retired])
        )

    with on_fault_point("commit.between-renames", between):
        tagged_bundle(tmp_path, dest, "new", overwrite=True)
    assert seen == [(False, [old])]
    assert _tags(dest) == ["new", "new"]
    assert _siblings(tmp_path) == ["b", "notes.txt"]  # no staging, no retired directory left
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_writer_publishing_between_the_two_renames_is_replaced_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without RENAME_EXCHANGE, another writer publishes at the destination between our two
    renames: our rename finds it, the bundle we moved aside is removed, and we go round again
    and replace theirs (the last writer wins); no staging or retired directory is left."""
    import shutil

    from bundles._local import commit as _commit

    dest = tagged_bundle(tmp_path, tmp_path / "b", "old")
    other = tagged_bundle(tmp_path, tmp_path / "src" / "b", "other")
    monkeypatch.setattr(_commit, "exchange", lambda a, b: False)
    rounds: list[Path] = []

    def publish_theirs(where: Path) -> None:
        rounds.append(where)
        if len(rounds) == 1:
            shutil.copytree(other, where, symlinks=True)

    with on_fault_point("commit.between-renames", publish_theirs):
        tagged_bundle(tmp_path, dest, "new", overwrite=True)
    assert rounds == [dest, dest]
    assert _tags(dest) == ["new", "new"]
    assert _siblings(tmp_path) == ["b", "src"]


# -- the publish path: upload_bundle, on moto ----------------------------------------------------
def test_upload_stats_count_what_was_sent_skipped_read_back_and_replaced(moto: Any, tmp_path: Path) -> None:
    from bundles import upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    media = sum(p.stat().st_size for p in (src / "media").iterdir())
    shard = (src / "samples" / "000000.msgpack.zst").stat().st_size
    url = f"s3://{moto.current}/r/b"
    put(moto, "r/b/notes.txt", b"mine\n")

    first = upload_bundle(src, url)
    gen1 = json.loads(contents(moto)["r/b/bundle.json"])["generation"]
    assert (first.generation, first.replaced, first.objects_restored) == (gen1, [], 0)
    assert (first.media_uploaded, first.media_skipped, first.objects_read_back) == (2, 0, 0)
    assert (first.objects, first.bytes_uploaded) == (4, media + shard)
    assert first.seconds > 0

    again = upload_bundle(src, url, overwrite=True, read_back=True)
    gen2 = json.loads(contents(moto)["r/b/bundle.json"])["generation"]
    assert again.generation == gen2 != gen1
    assert again.replaced == [f"r/b/{gen1}/manifest.json", f"r/b/{gen1}/samples/000000.msgpack.zst"]
    assert (again.media_uploaded, again.media_skipped, again.objects_read_back) == (0, 2, 4)
    assert (again.objects, again.bytes_uploaded) == (2, shard)
    left = contents(moto)
    assert not [k for k in left if gen1 in k] and left["r/b/notes.txt"] == b"mine\n"

    pooled = upload_bundle(src, f"s3://{moto.current}/r/c", shared_media=True)
    reused = upload_bundle(src, f"s3://{moto.current}/r/d", shared_media=True)
    assert (pooled.media_uploaded, pooled.media_skipped, pooled.objects_read_back) == (2, 0, 0)
    assert (reused.media_uploaded, reused.media_skipped, reused.objects_read_back) == (0, 2, 2)
    assert sorted(k for k in contents(moto) if k.startswith("r/.media/")) == sorted(
        f"r/.media/{p.name}" for p in (src / "media").iterdir()
    )


def _deleting(server: Any, key: str, rounds: int, then: bytes | None = None) -> Any:
    """A callback for ``store.after-publish`` that deletes ``key`` in its first ``rounds`` calls
    (a racing ``rm`` or ``gc``), and puts ``then`` as the pointer in the last of them."""
    import obstore

    calls: list[str] = []

    def delete(url: object) -> None:
        calls.append(str(url))
        if len(calls) <= rounds:
            obstore.delete(raw_store(server), key)
            if then is not None and len(calls) == rounds:
                put(server, "r/b/bundle.json", then)

    delete.calls = calls  # type: ignore[attr-defined]
    return delete


@pytest.mark.parametrize("rounds", [1, 3])
def test_objects_deleted_after_publishing_are_put_back_and_counted(
    moto: Any, tmp_path: Path, rounds: int
) -> None:
    from bundles import open_bundle, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    victim = f"r/b/media/{sorted(p.name for p in (src / 'media').iterdir())[0]}"
    url = f"s3://{moto.current}/r/b"
    delete = _deleting(moto, victim, rounds)
    with on_fault_point("store.after-publish", delete):
        stats = upload_bundle(src, url)
    assert stats.objects_restored == rounds and delete.calls == [url] * (rounds + 1)
    assert contents(moto)[victim] == (src / "media" / victim.rpartition("/")[2]).read_bytes()
    with open_bundle(url, verify="full") as b:
        assert len(b) == 2


def test_a_writer_gives_up_naming_the_race_when_its_objects_keep_being_deleted(
    moto: Any, tmp_path: Path
) -> None:
    from bundles import BundleError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    victim = f"r/b/media/{sorted(p.name for p in (src / 'media').iterdir())[0]}"
    url = f"s3://{moto.current}/r/b"
    put(moto, "r/b/notes.txt", b"mine\n")
    delete = _deleting(moto, victim, 99)
    with on_fault_point("store.after-publish", delete), pytest.raises(BundleError) as e:
        upload_bundle(src, url)
    gen = json.loads(contents(moto)["r/b/bundle.json"])["generation"]
    assert str(e.value) == (
        f"{url}: published, but objects its manifest lists kept being deleted (4 put back over 4 rounds: a "
        f"remove or gc of {url} racing this write); bundle.json names generation {gen}: write the bundle again"
    )
    assert len(delete.calls) == 4 and contents(moto)["r/b/notes.txt"] == b"mine\n"


@pytest.mark.parametrize("pointer", [b'{"format": "rollout-bundle-pointer"}', None], ids=["damaged", "other"])
def test_nothing_is_put_back_once_the_pointer_is_no_longer_ours(
    moto: Any, tmp_path: Path, pointer: bytes | None
) -> None:
    from bundles import upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    victim = f"r/b/media/{sorted(p.name for p in (src / 'media').iterdir())[0]}"
    other = Pointer(GEN, 12, DIGEST, False).to_bytes()
    delete = _deleting(moto, victim, 1, then=pointer or other)
    with on_fault_point("store.after-publish", delete):
        stats = upload_bundle(src, f"s3://{moto.current}/r/b")
    assert stats.objects_restored == 0 and victim not in contents(moto)
    assert contents(moto)["r/b/bundle.json"] == (pointer or other)


_COMMIT_POINTS = (
    "commit.before-rename",
    "commit.before-noreplace",
    "commit.between-renames",
    "commit.after-rename",
    "discard.after-manifest",
    "remove_bundle.before-retire",
    "remove_bundle.after-retire",
    "remove_bundle.after-manifest",
)


def _kind(name: str) -> str:
    for marker in (".staging.", ".retired."):
        if marker in name:
            return f"{name.split(marker)[0]}{marker}*"
    return name


class Steps:
    """Every fault point of the commit protocol passed, in order: its name, what it was told,
    and what a crash right there would leave in the parent (each entry, and whether it holds a
    manifest)."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent
        self.seen: list[tuple[str, str, list[str]]] = []

    def __enter__(self) -> Steps:
        import contextlib

        self.stack = contextlib.ExitStack()
        for name in _COMMIT_POINTS:
            self.stack.enter_context(on_fault_point(name, lambda *a, n=name: self.record(n, *a)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def record(self, name: str, where: Path) -> None:
        state = []
        for entry in sorted(os.listdir(self.parent)):
            if entry.startswith("run-"):
                continue
            manifest = (self.parent / entry / "manifest.json").exists()
            state.append(_kind(entry) + (" +manifest" if manifest else ""))
        self.seen.append((name, _kind(Path(where).name), state))


def test_the_commit_protocol_passes_its_points_in_order_leaving_what_its_docstring_says(
    tmp_path: Path,
) -> None:
    """At each fault point, what a crash would leave: the destination complete or missing, the
    previous bundle under a staging or retired name, its manifest gone before the rest."""
    from bundles import remove_bundle

    dest = tmp_path / "b"
    with Steps(tmp_path) as write:
        tagged_bundle(tmp_path, dest, "one")
    assert write.seen == [
        ("commit.before-rename", "b", [".b.staging.* +manifest"]),
        ("commit.before-noreplace", "b", [".b.staging.* +manifest"]),
        ("commit.after-rename", "b", ["b +manifest"]),
    ]
    with Steps(tmp_path) as replace:
        tagged_bundle(tmp_path, dest, "two", overwrite=True)
    assert replace.seen == [
        ("commit.before-rename", "b", [".b.staging.* +manifest", "b +manifest"]),
        ("commit.after-rename", "b", [".b.staging.* +manifest", "b +manifest"]),
        ("discard.after-manifest", ".b.staging.*", [".b.staging.*", "b +manifest"]),
    ]
    with Steps(tmp_path) as remove:
        remove_bundle(dest)
    assert remove.seen == [
        ("remove_bundle.before-retire", "b", ["b +manifest"]),
        ("remove_bundle.after-retire", "b", [".b.retired.* +manifest"]),
        ("discard.after-manifest", ".b.retired.*", [".b.retired.*"]),
    ]
    assert _siblings(tmp_path) == []


def test_removing_a_bundle_beside_a_users_file_unlinks_its_manifest_first(tmp_path: Path) -> None:
    from bundles import remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "one")
    (dest / "notes.txt").write_text("mine\n")
    (dest / "media" / "mine.txt").write_text("mine too\n")
    members = sorted(os.listdir(dest / "media"))
    seen: list[tuple[Path, list[str]]] = []

    def after_manifest(where: Path) -> None:
        seen.append((where, sorted(os.listdir(where))))

    with on_fault_point("remove_bundle.after-manifest", after_manifest):
        remove_bundle(dest)
    assert seen == [(dest, ["media", "notes.txt", "samples"])]
    assert sorted(os.listdir(dest)) == ["media", "notes.txt"]
    assert os.listdir(dest / "media") == ["mine.txt"] and "mine.txt" in members


def test_rm_racing_an_overwrite_says_exactly_what_happened(tmp_path: Path) -> None:
    from bundles import BundleError, remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "old")

    def overwrite(at: Path) -> None:
        tagged_bundle(tmp_path, at, "new", overwrite=True)

    with on_fault_point("remove_bundle.before-retire", overwrite), pytest.raises(BundleError) as e:
        remove_bundle(dest)
    assert str(e.value) == (
        f"{dest}: replaced by another writer while it was being removed (overwrite=True swapped a new "
        "bundle in): the new bundle is left in place and nothing was removed"
    )
    assert _tags(dest) == ["new", "new"] and _siblings(tmp_path) == ["b"]


# -- the deletion primitive on a store: remove_on_store, on moto ---------------------------------
def test_rm_on_a_store_removes_the_media_of_every_validated_generation_of_its_own(
    moto: Any, tmp_path: Path
) -> None:
    """An older generation of the bundle left under it (a replacement whose retire failed) has its
    media removed with it; a generation-named prefix whose manifest does not validate goes, its
    manifest names nothing; a user's medium and file under the bundle stay."""
    import obstore

    from bundles import remove_bundle

    url = store_bundle(moto, tmp_path, "r/b", "one")
    first = contents(moto)
    gen1 = json.loads(first["r/b/bundle.json"])["generation"]
    media1 = sorted(k for k in first if k.startswith("r/b/media/"))
    store_bundle(moto, tmp_path, "r/b", "two", overwrite=True)
    second = contents(moto)
    media2 = sorted(k for k in second if k.startswith("r/b/media/") and k not in media1)
    assert len(media1) == len(media2) == 2 and not [k for k in second if f"/{gen1}/" in k]
    for k, v in first.items():  # the first generation, as a failed retire leaves it
        if f"/{gen1}/" in k:
            obstore.put(raw_store(moto), k, v)
    put(moto, f"r/b/{GEN}/manifest.json", WEB)  # generation-named, ours by its names, no valid manifest
    users = {f"r/b/media/{'cd' * 32}.png": b"a user's picture\n", "r/b/notes.txt": b"mine\n"}
    for k, v in users.items():
        put(moto, k, v)
    assert [k for k in contents(moto) if k.startswith("r/b/media/")] == sorted(
        [*media1, *media2, f"r/b/media/{'cd' * 32}.png"]
    )
    remove_bundle(url)
    assert contents(moto) == users


def test_replacing_a_plain_copy_on_a_store_removes_its_manifest_and_shards_only(
    moto: Any, tmp_path: Path
) -> None:
    """A bundle copied verbatim (no pointer) replaced by ``overwrite=True``: its manifest and
    shards go, manifest first; a user's ``samples/notes.txt`` and the media stay (the new
    bundle's media are under the same names)."""
    from bundles import open_bundle, upload_bundle

    _plain_copy(moto, tmp_path)
    put(moto, "r/b/samples/notes.txt", b"mine\n")
    put(moto, "r/b/notes.txt", b"mine too\n")
    url = f"s3://{moto.current}/r/b"
    assert isinstance(examine(url), Proof)
    stats = upload_bundle(tagged_bundle(tmp_path, tmp_path / "new", "n"), url, overwrite=True)
    assert stats.replaced == ["r/b/manifest.json", "r/b/samples/000000.msgpack.zst"]
    left = contents(moto)
    assert left["r/b/samples/notes.txt"] == b"mine\n" and left["r/b/notes.txt"] == b"mine too\n"
    assert "r/b/manifest.json" not in left and "r/b/samples/000000.msgpack.zst" not in left
    with open_bundle(url, verify="full") as b:
        assert [s["tag"] for s in b] == ["n", "n"]


def test_a_large_object_deleted_after_publishing_is_put_back_in_parts(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the multipart threshold (made small here, as test_store_publish does) an object is
    put back from its local file by a multipart upload."""
    from bundles import open_bundle, upload_bundle
    from bundles._store import verify as _verify

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    victim = f"r/b/media/{sorted(p.name for p in (src / 'media').iterdir())[0]}"
    url = f"s3://{moto.current}/r/b"
    monkeypatch.setattr(_verify, "MULTIPART_THRESHOLD", 16)
    with on_fault_point("store.after-publish", _deleting(moto, victim, 1)):
        stats = upload_bundle(src, url)
    assert stats.objects_restored == 1
    assert contents(moto)[victim] == (src / "media" / victim.rpartition("/")[2]).read_bytes()
    with open_bundle(url, verify="full") as b:
        assert len(b) == 2


def test_removing_a_bundle_whose_samples_is_a_link_removes_its_media_and_follows_nothing(
    tmp_path: Path,
) -> None:
    """``samples`` swapped for a link to a user's directory: the link is not the bundle's and is
    kept, what it points at is untouched, and the bundle's media still go."""
    from bundles import remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "one")
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "000000.msgpack.zst").write_bytes(b"a user's file with a shard's name\n")
    import shutil

    shutil.rmtree(dest / "samples")
    (dest / "samples").symlink_to(elsewhere, target_is_directory=True)
    remove_bundle(dest)
    assert sorted(os.listdir(dest)) == ["samples"] and (dest / "samples").is_symlink()
    assert os.listdir(elsewhere) == ["000000.msgpack.zst"]


def test_listing_bundles_uses_the_storage_options_given_and_names_what_failed(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bundles import BundleNotFoundError, list_bundles

    url = store_bundle(moto, tmp_path, "r/b", "b")
    put(moto, "r/notes/manifest.json", WEB)
    for k in moto.env:
        monkeypatch.delenv(k)
    assert list_bundles(f"s3://{moto.current}/r", storage_options=moto.options()) == [url]
    from bundles import open_bundle

    with open_bundle(url, storage_options=moto.options()) as b:
        assert len(b) == 2
    with pytest.raises(BundleNotFoundError) as opened:
        open_bundle("s3://no-such-bucket-h7/x", storage_options=moto.options())
    assert str(opened.value).startswith(
        "s3://no-such-bucket-h7/x: cannot read the pointer: the bucket 'no-such-bucket-h7' does not exist"
    )
    with pytest.raises(BundleNotFoundError) as e:
        list_bundles("s3://no-such-bucket-h7/x", storage_options=moto.options())
    assert str(e.value).startswith(
        "s3://no-such-bucket-h7/x: cannot list the bundles: the bucket 'no-such-bucket-h7' does not exist"
    )


def test_a_damaged_local_bundle_is_refused_naming_its_manifest_and_removed_only_when_asked(
    tmp_path: Path,
) -> None:
    from bundles import remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "one")
    (dest / "manifest.json").write_bytes(b'{"format": "rollout-bundle", "format_version": 1}')
    (dest / "notes.txt").write_text("mine\n")
    with pytest.raises(BundleFormatError) as e:
        remove_bundle(dest)
    assert str(e.value) == (
        f"{dest}/manifest.json: kind: required field is missing: a damaged bundle, not removed; {DAMAGED_HINT}"
    )
    assert sorted(os.listdir(dest)) == ["manifest.json", "media", "notes.txt", "samples"]
    remove_bundle(dest, damaged=True)
    assert os.listdir(dest) == ["notes.txt"]


def test_a_store_destination_is_refused_by_what_it_holds_and_nothing_is_put(
    moto: Any, tmp_path: Path
) -> None:
    from bundles import BundleExistsError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    base = f"s3://{moto.current}"
    url = store_bundle(moto, tmp_path, "r/b", "b")
    put(moto, "r/dmg/bundle.json", b'{"format": "rollout-bundle-pointer"}')
    put(moto, "r/web/manifest.json", WEB)
    before = contents(moto)
    cases = {
        url: f"{url}: destination exists; pass overwrite=True to replace it",
        f"{base}/r/dmg": (
            f"{base}/r/dmg: destination holds a damaged bundle; refusing to replace it ({base}/r/dmg/bundle.json: "
            f"pointer_version: expected 1, found None); {DAMAGED_HINT}"
        ),
        f"{base}/r/web": (
            f"{base}/r/web: destination is not a bundle; refusing to replace it ({base}/r/web/manifest.json: not a "
            "rollout-bundle manifest (format: expected 'rollout-bundle', found None))"
        ),
    }
    for dest, message in cases.items():
        for overwrite in (False, True) if dest != url else (False,):
            with pytest.raises(BundleExistsError) as e:
                upload_bundle(src, dest, overwrite=overwrite)
            assert str(e.value) == message
    assert contents(moto) == before


def test_upload_bundle_refuses_a_packed_file_naming_it(moto: Any, tmp_path: Path) -> None:
    from bundles import BundleError, pack_bundle, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    packed = tmp_path / "s.rbundle"
    pack_bundle(src, packed)
    with pytest.raises(BundleError) as e:
        upload_bundle(packed, f"s3://{moto.current}/r/b")
    assert (
        str(e.value) == f"{packed}: upload_bundle takes a bundle directory; pack_bundle uploads a packed file"
    )
    assert contents(moto) == {}


def _generation_keys(server: Any, prefix: str) -> list[str]:
    return [k for k in contents(server) if k.startswith(prefix) and k[len(prefix) :].startswith("g")]


@pytest.mark.parametrize(
    ("after", "says"),
    [
        ("other", "names generation " + GEN),
        ("gone", "is gone"),
        ("damaged", "is not one this version reads"),
    ],
)
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_writer_whose_pointer_is_replaced_right_after_its_put_is_told_it_lost(
    moto: Any, tmp_path: Path, after: str, says: str, overwrite: bool
) -> None:
    import obstore

    from bundles import BundleError, BundleExistsError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    url = f"s3://{moto.current}/r/b"
    put(moto, "r/notes.txt", b"mine\n")
    ours: list[str] = []

    def replace(_: object) -> None:
        ours.append(json.loads(contents(moto)["r/b/bundle.json"])["generation"])
        if after == "gone":
            obstore.delete(raw_store(moto), "r/b/bundle.json")
        else:
            put(
                moto,
                "r/b/bundle.json",
                Pointer(GEN, 12, DIGEST, False).to_bytes() if after == "other" else b"{}",
            )

    with on_fault_point("store.before-confirm", replace), pytest.raises(BundleError) as e:
        upload_bundle(src, url, overwrite=overwrite)
    assert type(e.value) is (BundleError if overwrite else BundleExistsError)
    assert str(e.value) == (
        f"{url}: this writer lost: read back right after it was put, bundle.json {says}, not ours ({ours[0]}); "
        "another writer put it over ours (a store that drops If-None-Match/If-Match, or one that replaced the "
        "bundle at once), and our generation is removed. Nothing of theirs was changed"
    )
    assert not _generation_keys(moto, "r/b/") and contents(moto)["r/notes.txt"] == b"mine\n"


def test_a_writer_whose_generation_is_deleted_right_after_its_pointer_is_told_so(
    moto: Any, tmp_path: Path
) -> None:
    import obstore

    from bundles import BundleError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    url = f"s3://{moto.current}/r/b"
    ours: list[str] = []

    def remove_generation(_: object) -> None:
        ours.append(json.loads(contents(moto)["r/b/bundle.json"])["generation"])
        obstore.delete(raw_store(moto), f"r/b/{ours[0]}/manifest.json")

    with on_fault_point("store.before-confirm", remove_generation), pytest.raises(BundleError) as e:
        upload_bundle(src, url)
    assert str(e.value) == (
        f"{url}: published, but generation {ours[0]} was deleted meanwhile (a remove or gc of {url} raced this "
        "write): bundle.json names nothing readable; write the bundle again"
    )


def test_a_pool_object_with_other_bytes_is_named_and_nothing_is_published(moto: Any, tmp_path: Path) -> None:
    """Two pool objects with the right size and other bytes, one with another size: every one is
    named with what was expected and found, in the manifest's order; the old bundle stays."""
    from bundles import BundleVerificationError, upload_bundle

    url = store_bundle(moto, tmp_path, "r/b", "old", shared_media=True)
    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    names = sorted(p.name for p in (src / "media").iterdir())
    goods = [(src / "media" / n).read_bytes() for n in names]
    bads = [bytes(b ^ 0xFF for b in goods[0]), goods[1] + b"!"]
    for n, bad in zip(names, bads, strict=True):
        put(moto, f"r/.media/{n}", bad)
    before = contents(moto)
    with pytest.raises(BundleVerificationError) as e:
        upload_bundle(src, url, overwrite=True, shared_media=True)

    def sha(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    base = f"s3://{moto.current}/r/.media"
    problems = [
        f"{base}/{names[0]}: expected {len(goods[0])} bytes with {sha(goods[0])}, found {len(bads[0])} bytes with "
        f"{sha(bads[0])} (an object this writer did not upload; left as it is)",
        f"{base}/{names[1]}: expected {len(goods[1])} bytes with {sha(goods[1])}, found {len(bads[1])} bytes with "
        "(not read) (an object this writer did not upload; left as it is)",
    ]
    assert e.value.problems == problems
    assert str(e.value).startswith(
        f"{url} (not published; the bundle there is unchanged): bundle failed verification"
    )
    assert contents(moto) == before


def test_a_path_the_system_refuses_to_look_at_is_an_error_naming_it(tmp_path: Path) -> None:
    from bundles import BundleError

    long = tmp_path / ("x" * 300)
    with pytest.raises(BundleError) as e:
        examine_directory(long)
    assert str(e.value) == f"{long}: cannot look at it: File name too long"


def test_a_huge_manifest_is_judged_by_reading_one_byte_past_the_cap(tmp_path: Path) -> None:
    """A sparse manifest of 5x the cap: the proof reads at most the cap + 1 byte (peak RSS in a
    subprocess), whatever the file's size."""
    import subprocess
    import sys

    d = tmp_path / "d"
    d.mkdir()
    with open(d / "manifest.json", "wb") as f:
        f.truncate(5 * MAX_MANIFEST_BYTES)
    code = (
        "import resource, sys; from bundles._local.proof import examine_directory; "
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        f"found = examine_directory({str(d)!r}); "
        "print(found.reason); print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    reason, grew_mib = done.stdout.splitlines()
    assert reason == f"{d}/manifest.json: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap"
    assert int(grew_mib) < 2 * MAX_MANIFEST_BYTES // 2**20, done.stdout


def test_an_upload_to_a_missing_bucket_says_what_it_was_doing(moto: Any, tmp_path: Path) -> None:
    from bundles import BundleNotFoundError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    with pytest.raises(BundleNotFoundError) as e:
        upload_bundle(src, "s3://no-such-bucket-h7/b")
    assert str(e.value).startswith(
        "s3://no-such-bucket-h7/b: cannot look for an existing bundle: the bucket 'no-such-bucket-h7' does not exist"
    )


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_pointer_that_appears_damaged_before_publishing_is_never_replaced(
    moto: Any, tmp_path: Path, overwrite: bool
) -> None:
    """Something that claims to be a pointer and does not parse appears between the proof and
    the publish: not ours to judge, so it is never replaced; the new generation is removed."""
    from bundles import BundleError, BundleExistsError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    url = f"s3://{moto.current}/r/b"
    damaged = b'{"format": "rollout-bundle-pointer"}'
    appear = on_fault_point("store.before-publish", lambda: put(moto, "r/b/bundle.json", damaged))
    with appear, pytest.raises(BundleError) as e:
        upload_bundle(src, url, overwrite=overwrite)
    if overwrite:
        assert str(e.value) == f"{url}: other writers kept replacing the bundle; gave up after 16 tries"
    else:
        assert type(e.value) is BundleExistsError
        assert str(e.value) == f"{url}: destination exists; pass overwrite=True to replace it"
    assert contents(moto)["r/b/bundle.json"] == damaged and not _generation_keys(moto, "r/b/")


def test_rm_of_a_plain_copy_on_a_store_removes_only_what_its_manifest_lists(
    moto: Any, tmp_path: Path
) -> None:
    from bundles import remove_bundle

    _plain_copy(moto, tmp_path)
    from bundles import open_bundle

    with open_bundle(f"s3://{moto.current}/r/b", verify="full") as b:  # its media under r/b/media
        assert [s["tag"] for s in b] == ["s", "s"]
    users = {
        "r/b/samples/notes.txt": b"mine\n",
        "r/b/samples/000001.msgpack.zst": b"a shard's name, not listed\n",
        f"r/b/media/{'cd' * 32}.png": b"a user's picture\n",
        "r/b/README": b"mine too\n",
        "r/bb/manifest.json": b"a neighbour's\n",
    }
    for k, v in users.items():
        put(moto, k, v)
    remove_bundle(f"s3://{moto.current}/r/b")
    assert contents(moto) == users


def test_a_damaged_pointer_bundle_on_a_store_is_removed_only_when_asked_and_only_its_own(
    moto: Any, tmp_path: Path
) -> None:
    from bundles import remove_bundle

    url = store_bundle(moto, tmp_path, "r/b", "b")
    gen = json.loads(contents(moto)["r/b/bundle.json"])["generation"]
    put(moto, "r/b/bundle.json", b'{"format": "rollout-bundle-pointer", "generation": 7}')
    users = {
        "r/b/notes.txt": b"mine\n",
        f"r/b/{GEN}/notes.txt": b"a generation-named prefix holding a user's file\n",
        "r/c/bundle.json": b"a neighbour's\n",
    }
    for k, v in users.items():
        put(moto, k, v)
    before = contents(moto)
    from bundles import open_bundle

    with pytest.raises(BundleFormatError) as opened:
        open_bundle(url)
    assert str(opened.value) == f"{url}/bundle.json: pointer_version: expected 1, found None"
    with pytest.raises(BundleFormatError) as e:
        remove_bundle(url)
    assert str(e.value) == (
        f"{url}/bundle.json: pointer_version: expected 1, found None: a damaged bundle, not removed; {DAMAGED_HINT}"
    )
    assert contents(moto) == before
    remove_bundle(url, damaged=True)
    left = contents(moto)
    assert {k: v for k, v in left.items() if not k.startswith("r/b/media/")} == users
    assert (
        not [k for k in left if f"/{gen}/" in k] and len([k for k in left if k.startswith("r/b/media/")]) == 2
    )


def test_an_oversize_pointer_is_refused_unread_by_every_reader(moto: Any, tmp_path: Path) -> None:
    from bundles import UnsafeBundleError, open_bundle

    url = f"s3://{moto.current}/r/big"
    put(moto, "r/big/bundle.json", b" " * (MAX_POINTER_BYTES + 1))
    with pytest.raises(UnsafeBundleError) as e:
        open_bundle(url)
    assert str(e.value).startswith(
        f"{url}/bundle.json: {MAX_POINTER_BYTES + 1} bytes exceeds the pointer cap of {MAX_POINTER_BYTES} bytes"
    )


def test_a_generation_is_named_by_the_utc_time_whatever_the_local_zone(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime
    import time

    from bundles import upload_bundle

    monkeypatch.setenv("TZ", "Etc/GMT-9")  # nine hours ahead of UTC
    time.tzset()
    try:
        stats = upload_bundle(tagged_bundle(tmp_path, tmp_path / "src", "s"), f"s3://{moto.current}/r/b")
    finally:
        monkeypatch.undo()
        time.tzset()
    named = datetime.datetime.strptime(stats.generation[1:22], "%Y%m%dT%H%M%S%f").replace(
        tzinfo=datetime.timezone.utc
    )
    assert abs(datetime.datetime.now(datetime.timezone.utc) - named) < datetime.timedelta(hours=1)


def test_rm_on_a_store_uses_the_storage_options_given_and_names_what_failed(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bundles import BundleNotFoundError, remove_bundle

    url = store_bundle(moto, tmp_path, "r/b", "b")
    put(moto, "r/b/notes.txt", b"mine\n")
    for k in moto.env:
        monkeypatch.delenv(k)
    remove_bundle(url, storage_options=moto.options())
    assert contents(moto) == {"r/b/notes.txt": b"mine\n"}
    with pytest.raises(BundleNotFoundError) as e:
        remove_bundle("s3://no-such-bucket-h7/x", storage_options=moto.options())
    assert str(e.value).startswith(
        "s3://no-such-bucket-h7/x: cannot look for a bundle: the bucket 'no-such-bucket-h7' does not exist"
    )


@pytest.mark.parametrize("threshold", [1 << 20, 16], ids=["one-get", "windows"])
def test_a_read_back_hashes_exactly_the_bytes_stored(
    moto: Any, monkeypatch: pytest.MonkeyPatch, threshold: int
) -> None:
    """The read-back's verdicts by one GET and in windows (threshold and window made small, as
    test_store_publish does on SeaweedFS), compared whole: size and digest of every byte read."""
    from bundles._store import verify as _verify

    monkeypatch.setattr(_verify, "MULTIPART_THRESHOLD", threshold)
    monkeypatch.setattr(_verify, "READ_WINDOW", 5)
    store = get_store(StoreURL(f"s3://{moto.current}/x"))
    data = bytes(range(23))
    put(moto, "x/obj", data)
    put(moto, "x/one", b"z")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert _verify.stored_digest(store, "x/obj", 23) == (23, digest)
    assert _verify.stored_digest(store, "x/obj", 22) == (23, "(not read)")
    shorter = (23, "(not read)") if threshold == 16 else (23, digest)  # windows: its size, from a HEAD
    assert _verify.stored_digest(store, "x/obj", 24) == shorter
    assert _verify.stored_digest(store, "x/one", 1) == (1, "sha256:" + hashlib.sha256(b"z").hexdigest())
    assert _verify.stored_digest(store, "x/none", 23) is None
    assert _verify.stored_digest(store, "x/none", 17) is None


def test_overwrite_replaces_only_a_proven_bundle_or_an_empty_directory_and_says_why_not(
    tmp_path: Path,
) -> None:
    from bundles import BundleExistsError

    def refused(dest: Path) -> str:
        before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        with pytest.raises(BundleExistsError) as e:
            tagged_bundle(tmp_path, dest, "new", overwrite=True)
        assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
        return str(e.value)

    web = tmp_path / "web"
    web.mkdir()
    (web / "manifest.json").write_bytes(WEB)
    assert refused(web) == (
        f"{web}: destination exists and is not a bundle; refusing to replace it ({web}/manifest.json: not a "
        "rollout-bundle manifest (format: expected 'rollout-bundle', found None))"
    )
    dmg = tmp_path / "dmg"
    dmg.mkdir()
    (dmg / "manifest.json").write_bytes(b'{"format": "rollout-bundle"}')
    assert refused(dmg) == (
        f"{dmg}: destination exists and is a damaged bundle; refusing to replace it ({dmg}/manifest.json: "
        f"format_version: expected one of [1], found None; a newer rollout-bundles may read it); {DAMAGED_HINT}"
    )
    crowded = tagged_bundle(tmp_path, tmp_path / "crowded", "old")
    for i in range(6):
        (crowded / f"note{i}.txt").write_text("mine\n")
    assert refused(crowded) == (
        f"{crowded}: holds note0.txt, note1.txt, note2.txt, note3.txt, note4.txt, +1 more beside the bundle, which "
        "are not the bundle's: refusing to replace it (replacing swaps the whole directory); move them, or remove "
        "the bundle first (remove_bundle keeps them)"
    )
    few = tagged_bundle(tmp_path, tmp_path / "few", "old")
    (few / "samples" / "notes.txt").write_text("mine\n")
    assert refused(few).startswith(
        f"{few}: holds samples/notes.txt beside the bundle, which are not the bundle's"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _tags(tagged_bundle(tmp_path, empty, "new", overwrite=True)) == ["new", "new"]
    with pytest.raises(BundleExistsError) as e:
        tagged_bundle(tmp_path, empty, "again")
    assert str(e.value) == f"{empty}: destination exists; pass overwrite=True to replace it"


def test_rm_damaged_of_a_plain_copy_on_a_store_removes_the_formats_names_only(
    moto: Any, tmp_path: Path
) -> None:
    from bundles import remove_bundle

    _plain_copy(moto, tmp_path)
    put(moto, "r/b/manifest.json", b'{"format": "rollout-bundle"}')
    users = {"r/b/samples/notes.txt": b"mine\n", "r/b/media/notes.txt": b"mine too\n", "r/b/README": b"!\n"}
    for k, v in users.items():
        put(moto, k, v)
    remove_bundle(f"s3://{moto.current}/r/b", damaged=True)
    assert contents(moto) == users


def test_a_listed_medium_swapped_for_a_link_is_not_the_bundles_and_is_kept(tmp_path: Path) -> None:
    """A link named like a medium the manifest lists is not the bundle's file (only regular files
    are): it is kept, and what it points at is untouched."""
    from bundles import remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "one")
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"a user's picture\n")
    medium = sorted((dest / "media").iterdir())[0]
    medium.unlink()
    medium.symlink_to(mine)
    remove_bundle(dest)
    assert sorted(os.listdir(dest)) == ["media"] and os.listdir(dest / "media") == [medium.name]
    assert medium.is_symlink() and mine.read_bytes() == b"a user's picture\n"


@pytest.mark.parametrize(
    ("point", "message"),
    [
        ("commit.before-rename", "destination exists; pass overwrite=True to replace it"),
        ("commit.before-noreplace", "destination appeared during the write; not replaced"),
    ],
)
def test_a_destination_that_appears_during_a_write_is_not_replaced(
    tmp_path: Path, point: str, message: str
) -> None:
    from bundles import BundleExistsError

    dest = tmp_path / "b"

    def appear(where: Path) -> None:
        where.mkdir()
        (where / "notes.txt").write_text("mine\n")

    with on_fault_point(point, appear), pytest.raises(BundleExistsError) as e:
        tagged_bundle(tmp_path, dest, "new")
    assert str(e.value) == f"{dest}: {message}"
    assert os.listdir(dest) == ["notes.txt"] and (dest / "notes.txt").read_text() == "mine\n"


def test_a_medium_edited_in_place_is_never_uploaded_under_its_old_name(moto: Any, tmp_path: Path) -> None:
    from bundles import MediaMissingError, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    medium = sorted((src / "media").iterdir())[0]
    edited = b"edited in place\n"
    medium.chmod(0o644)
    medium.write_bytes(edited)
    url = f"s3://{moto.current}/r/b"
    with pytest.raises(MediaMissingError) as e:
        upload_bundle(src, url)
    assert str(e.value) == (
        f"{url}: media/{medium.name}: the file's bytes hash to sha256:{hashlib.sha256(edited).hexdigest()}, not "
        "the digest it is stored under (edited in place after it was linked?); not uploaded"
    )
    assert not [k for k in contents(moto) if k.endswith(medium.name) or k.endswith("bundle.json")]


def test_an_overwrite_replaces_a_bundle_another_writer_published_during_its_write(tmp_path: Path) -> None:
    """``overwrite=True``: a bundle published at the destination between our check and our
    rename is replaced (the last writer wins), and nothing is left beside it."""
    import shutil

    dest = tmp_path / "b"
    other = tagged_bundle(tmp_path, tmp_path / "src" / "b", "other")

    def publish_theirs(where: Path) -> None:
        shutil.copytree(other, where, symlinks=True)

    with on_fault_point("commit.before-noreplace", publish_theirs):
        tagged_bundle(tmp_path, dest, "new", overwrite=True)
    assert _tags(dest) == ["new", "new"] and _siblings(tmp_path) == ["b", "src"]


def test_rm_of_a_pooled_bundle_leaves_its_prefixs_media_and_the_pool(moto: Any, tmp_path: Path) -> None:
    """A bundle whose media are in the shared pool owns nothing under ``U/media``: a file there
    named like one of its media (a user's copy) stays, and so does the pool (gc's to collect)."""
    from bundles import remove_bundle

    url = store_bundle(moto, tmp_path, "r/b", "b", shared_media=True)
    pool = {k: v for k, v in contents(moto).items() if k.startswith("r/.media/")}
    copies = {f"r/b/media/{k.rpartition('/')[2]}": v for k, v in pool.items()}
    for k, v in copies.items():
        put(moto, k, v)
    remove_bundle(url)
    assert contents(moto) == {**pool, **copies}


def test_a_pointer_naming_a_manifest_over_the_cap_is_damaged_and_the_manifest_unread(moto: Any) -> None:
    base = f"s3://{moto.current}"
    big = MAX_MANIFEST_BYTES + 1
    put(moto, "r/huge/bundle.json", Pointer(GEN, 12, DIGEST, False).to_bytes())
    put(moto, f"r/huge/{GEN}/manifest.json", b" " * big)
    assert examine(f"{base}/r/huge") == NotProven(
        f"{base}/r/huge",
        f"{base}/r/huge/{GEN}/manifest.json: {big} bytes exceeds the manifest cap of {MAX_MANIFEST_BYTES} bytes",
        damaged=True,
    )


@pytest.mark.parametrize("swap", ["link", "file"])
def test_a_samples_directory_swapped_once_the_manifest_is_gone_is_neither_followed_nor_emptied(
    tmp_path: Path, swap: str
) -> None:
    """A bundle beside a user's file loses its manifest first; if ``samples/`` is then swapped
    for a link to a user's directory (or for a file), nothing is followed or unlinked through it,
    and ``media/`` after it is still emptied and removed."""
    from bundles import remove_bundle

    dest = tagged_bundle(tmp_path, tmp_path / "b", "one")
    (dest / "notes.txt").write_text("mine\n")
    shards = sorted(os.listdir(dest / "samples"))
    user = tmp_path / "user"
    user.mkdir()
    for name in shards:  # the user's files carry the shards' names
        (user / name).write_text(f"mine: {name}\n")
    seen: list[Path] = []

    def swap_samples(where: Path) -> None:
        seen.append(where)
        os.rename(where / "samples", tmp_path / "shards-aside")
        if swap == "link":
            os.symlink(user, where / "samples")
        else:
            (where / "samples").write_text("a file of mine\n")

    with on_fault_point("remove_bundle.after-manifest", swap_samples):
        remove_bundle(dest)
    assert seen == [dest]
    assert sorted(os.listdir(dest)) == ["notes.txt", "samples"]
    assert sorted(os.listdir(user)) == shards
    assert all((user / name).read_text() == f"mine: {name}\n" for name in shards)
    if swap == "link":
        assert os.readlink(dest / "samples") == str(user)
    else:
        assert (dest / "samples").read_text() == "a file of mine\n"
    assert (dest / "notes.txt").read_text() == "mine\n"


def test_objects_deleted_before_the_read_back_are_put_again_from_the_local_copy(
    moto: Any, tmp_path: Path
) -> None:
    """``read_back=True``: the read-back is told the bundle's URL, and an object deleted before
    it reads it back is put again from the writer's local copy, so that what is published is whole."""
    import obstore

    from bundles import open_bundle, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    url = f"s3://{moto.current}/r/b"
    seen: list[str] = []
    before: dict[str, bytes] = {}

    def delete_all(where: str) -> None:
        seen.append(where)
        before.update(contents(moto))
        for key in before:
            obstore.delete(raw_store(moto), key)

    with on_fault_point("store.before-verify", delete_all):
        upload_bundle(src, url, read_back=True)
    assert seen == [url] and before
    after = contents(moto)
    assert {k: after.get(k) for k in before} == before
    assert [s["tag"] for s in open_bundle(url).samples()] == ["s", "s"]


def test_an_upload_uses_the_storage_options_given_and_never_replaces_by_default(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the environment's credentials, ``upload_bundle`` reaches the store through the
    storage options alone; a second upload to the same URL without ``overwrite`` is refused."""
    from bundles import BundleExistsError, open_bundle, upload_bundle

    src = tagged_bundle(tmp_path, tmp_path / "src", "s")
    url = f"s3://{moto.current}/r/b"
    for k in moto.env:
        monkeypatch.delenv(k)
    upload_bundle(src, url, storage_options=moto.options())
    before = contents(moto)
    other = tagged_bundle(tmp_path, tmp_path / "other", "o")
    with pytest.raises(BundleExistsError) as e:
        upload_bundle(other, url, storage_options=moto.options())
    assert str(e.value) == f"{url}: destination exists; pass overwrite=True to replace it"
    assert contents(moto) == before
    tags = [s["tag"] for s in open_bundle(url, storage_options=moto.options()).samples()]
    assert tags == ["s", "s"]
