"""bundles._store.client.Store, the interface the store protocol is written against (issue 31, item 2).

Its methods raise only BundleErrors naming the object's URL and the operation, translated once
inside the obstore implementation (checked against moto and, for refused credentials,
SeaweedFS, which checks signatures); and a backend is one class: an in-memory Store plugged into
the scheme table carries the whole protocol (write, read in place, list, remove, gc).
"""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

from bundles import BucketNotFoundError, BundleError, collect_garbage, list_bundles, open_bundle, write_bundle
from bundles import remove_bundle as remove_bundle_at
from bundles._errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreBucketNotFoundError,
)
from bundles._store.client import ObstoreStore, Store, clear_store_cache, get_store, naming
from bundles._store.probe import forget_verdicts
from bundles._urls import SCHEMES, STORE_SCHEMES, Scheme, StoreURL


@pytest.fixture
def store(moto_s3: Any) -> Iterator[Store]:
    clear_store_cache()
    yield get_store(StoreURL(f"s3://{moto_s3.bucket()}"), moto_s3.options())
    clear_store_cache()


def test_store_is_an_interface_and_obstore_serves_every_scheme_of_the_one_table() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Store()  # type: ignore[abstract]
    assert issubclass(ObstoreStore, Store)
    assert STORE_SCHEMES == tuple(SCHEMES) == ("s3", "gs", "az")
    assert {row.store for row in SCHEMES.values()} == {"ObstoreStore"}
    from bundles._urls import STORE_SCHEMES as read_by_location

    assert read_by_location is STORE_SCHEMES  # one table, not a copy


def test_absent_and_existing_objects_are_values_or_one_class_each(store: Store) -> None:
    url = store.url_of("nope")
    assert store.head("nope") is None
    with pytest.raises(ObjectNotFoundError) as e:
        store.get("nope")
    assert str(e.value) == f"{url}: not found"
    assert not isinstance(e.value, BucketNotFoundError)
    with pytest.raises(ObjectNotFoundError, match=f"^{url}: not found"):
        store.get_range("nope", 0, 4)

    tag = store.put_new("k", b"one")
    with pytest.raises(ObjectExistsError, match=rf"^{store.url_of('k')}: exists already"):
        store.put_new("k", b"two")
    assert store.put_create("k", b"two") is False
    assert store.put_swap("k", b"three", '"not-its-etag"') is False
    assert store.get("k")[0] == b"one"
    assert store.put_swap("k", b"three", tag) is True
    assert store.get("k")[0] == b"three"
    assert store.files("") == ["k"] and [m["path"] for m in store.listing("")] == ["k"]
    assert list(store.listing_pages("")) == [[("k", 5)]]
    store.delete(["k", "never-was"])  # an absent key is no error
    assert store.head("k") is None


def test_a_missing_bucket_is_named_by_every_request_and_naming_keeps_the_class(moto_s3: Any) -> None:
    clear_store_cache()
    store = get_store(StoreURL("s3://no-such-bucket-h9"), moto_s3.options())
    calls = {
        "read the object": lambda: store.get("a/k"),
        "write the object": lambda: store.put("a/k", b"x"),
        "create the object": lambda: store.put_new("a/k", b"x"),
        "list": lambda: store.listing("a"),
        "list ": lambda: list(store.listing_pages("a")),  # the pages: the same failure
    }
    for what, call in calls.items():
        with pytest.raises(StoreBucketNotFoundError) as e:
            call()
        assert isinstance(e.value, BucketNotFoundError)
        what = what.strip()
        url = "s3://no-such-bucket-h9/a" if what == "list" else "s3://no-such-bucket-h9/a/k"
        assert str(e.value).startswith(
            f"{url}: cannot {what}: the bucket 'no-such-bucket-h9' does not exist (create it first"
        ), str(e.value)
    # A caller names the bundle: the same class and reason, the object's error as the cause;
    # an outer naming leaves a failure named already as it is.
    with (
        pytest.raises(StoreBucketNotFoundError) as named,
        naming("s3://no-such-bucket-h9/outer", "do the outer thing"),
        naming("s3://no-such-bucket-h9/b", "read the bundle"),
    ):
        store.get("b/bundle.json")
    assert str(named.value).startswith(
        "s3://no-such-bucket-h9/b: cannot read the bundle: the bucket 'no-such-bucket-h9' does not exist"
    )
    assert isinstance(named.value.__cause__, StoreBucketNotFoundError)
    assert "s3://no-such-bucket-h9/b/bundle.json" in str(named.value.__cause__)
    # Anything not the store's passes through naming unchanged.
    with pytest.raises(KeyError), naming("s3://b/x", "read"):
        raise KeyError("x")
    clear_store_cache()


@pytest.mark.slow
def test_refused_credentials_are_one_class_from_every_method(seaweed_s3: Any) -> None:
    """SeaweedFS checks signatures (moto does not): each method of the interface says the same."""
    bucket = seaweed_s3.bucket()
    clear_store_cache()
    store = get_store(StoreURL(f"s3://{bucket}"), {**seaweed_s3.options(), "secret_access_key": "wrong"})
    calls = {
        "put": lambda: store.put("k", b"x"),
        "put_new": lambda: store.put_new("k", b"x"),
        "put_create": lambda: store.put_create("k", b"x"),
        "put_swap": lambda: store.put_swap("k", b"x", '"e"'),
        "get": lambda: store.get("k"),
        "get_range": lambda: store.get_range("k", 0, 1),
        "get_ranges": lambda: store.get_ranges("k", [0], [1]),
        "head": lambda: store.head("k"),
        "listing": lambda: store.listing("p"),
        "listing_pages": lambda: list(store.listing_pages("p")),
        "children": lambda: store.children("p"),
        "files": lambda: store.files("p"),
        "delete": lambda: store.delete(["k"]),
    }
    for name, call in calls.items():
        with pytest.raises(StoreAccessDeniedError) as e:
            call()
        message = str(e.value)
        assert message.startswith(f"s3://{bucket}/"), (name, message)
        assert ": cannot " in message and "access denied (check the credentials) [403" in message, (
            name,
            message,
        )
        assert "Debug" not in message and "\n" not in message, (name, message)
    clear_store_cache()


class MemoryStore(Store):
    """A whole backend in one class: a bucket held in a dict (for the test below)."""

    buckets: ClassVar[dict[str, dict[str, tuple[bytes, str, datetime.datetime]]]] = {}

    def __init__(self, scheme: str, bucket: str, options: Any) -> None:
        self.scheme, self.bucket, self.endpoint = scheme, bucket, "memory"
        self.single_writer = False
        self.objects = self.buckets.setdefault(bucket, {})
        self.lock = threading.Lock()
        self.n = 0
        self.heads = 0

    def _meta(self, key: str) -> dict[str, Any]:
        data, tag, when = self.objects[key]
        return {"path": key, "size": len(data), "e_tag": tag, "last_modified": when}

    def _set(self, key: str, data: Any) -> str:
        self.n += 1
        tag = f'"{self.n}"'
        self.objects[key] = (bytes(data), tag, datetime.datetime.now(datetime.timezone.utc))
        return tag

    def put(self, key: str, data: Any) -> str | None:
        with self.lock:
            return self._set(key, data)

    def put_new(self, key: str, data: Any) -> str | None:
        with self.lock:
            if key in self.objects:
                raise ObjectExistsError(f"{self.url_of(key)}: exists already")
            return self._set(key, data)

    def put_swap(self, key: str, data: Any, etag: str | None) -> bool:
        with self.lock:
            if key not in self.objects or self.objects[key][1] != etag:
                return False
            self._set(key, data)
            return True

    def put_large(self, key: str, path: Any) -> None:
        with open(path, "rb") as f:
            self.put(key, f.read())

    def delete(self, keys: list[str]) -> None:
        with self.lock:
            for k in keys:
                self.objects.pop(k, None)

    def get(self, key: str, max_bytes: int | None = None, cap: str = "cap") -> tuple[bytes, dict[str, Any]]:
        with self.lock:
            if key not in self.objects:
                raise ObjectNotFoundError(f"{self.url_of(key)}: not found")
            return self.objects[key][0], self._meta(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.get(key)[0][start:end]

    def get_ranges_buffers(self, key: str, starts: list[int], ends: list[int]) -> list[Any]:
        data = self.get(key)[0]
        return [data[s:e] for s, e in zip(starts, ends, strict=True)]

    def head(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            self.heads += 1
            return self._meta(key) if key in self.objects else None

    def _under(self, prefix: str) -> list[str]:
        base = prefix.rstrip("/") + "/" if prefix else ""
        with self.lock:
            return sorted(k[len(base) :] for k in self.objects if k.startswith(base))

    def listing(self, prefix: str) -> list[dict[str, Any]]:
        base = prefix.rstrip("/") + "/" if prefix else ""
        with self.lock:
            return [self._meta(k) for k in sorted(self.objects) if k.startswith(base)]

    def children(self, prefix: str) -> list[str]:
        return sorted({rel.split("/", 1)[0] for rel in self._under(prefix) if "/" in rel})

    def files(self, prefix: str) -> list[str]:
        return [rel for rel in self._under(prefix) if "/" not in rel]


def test_a_backend_is_one_class_the_whole_protocol_runs_on(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The s3 row of the one scheme table pointed at MemoryStore: write, read in place (prefix and
    packed object), list, remove and gc go through the Store interface alone."""
    monkeypatch.setitem(SCHEMES, "s3", Scheme("s3", ("AWS_",), (), "nothing", store=MemoryStore))
    clear_store_cache()
    forget_verdicts()
    MemoryStore.buckets.clear()
    try:
        image = tmp_path / "run" / "a.png"
        image.parent.mkdir()
        image.write_bytes(b"\x89PNG not really")
        samples = [{"index": i, "image": str(image)} for i in range(3)]
        written = write_bundle("s3://mem/runs/b0", samples, media_roots=[image.parent], shared_media=True)
        assert str(written) == "s3://mem/runs/b0"
        write_bundle("s3://mem/runs/b1.rbundle", samples, media_roots=[image.parent])
        other = image.parent / "b.png"
        other.write_bytes(b"\x89PNG another")
        kept = hashlib.sha256(other.read_bytes()).hexdigest() + ".png"
        write_bundle(
            "s3://mem/runs/b2", [{"image": str(other)}], media_roots=[image.parent], shared_media=True
        )
        objects = MemoryStore.buckets["mem"]
        assert "runs/b0/bundle.json" in objects and "runs/b1.rbundle" in objects
        assert any(k.startswith("runs/.media/") for k in objects)
        for url in ("s3://mem/runs/b0", "s3://mem/runs/b1.rbundle"):
            with open_bundle(url) as b:
                got = list(b)
                assert [s["index"] for s in got] == [0, 1, 2]
                with b.open_media(got[0]["image"]) as f:
                    assert f.read() == image.read_bytes()
                b.verify(full=True)
        assert list_bundles("s3://mem/runs") == [
            "s3://mem/runs/b0",
            "s3://mem/runs/b1.rbundle",
            "s3://mem/runs/b2",
        ]
        with pytest.raises(BundleError, match=r"^s3://mem/runs/b0: destination exists"):
            write_bundle("s3://mem/runs/b0", samples, media_roots=[image.parent])
        remove_bundle_at("s3://mem/runs/b0")
        with pytest.raises(BundleError, match=r"^s3://mem/runs/b0: no bundle here"):
            open_bundle("s3://mem/runs/b0")
        # A pool gc judges by the pointers beside it: b0's media go, b2's stay.
        report = collect_garbage("s3://mem/runs", older_than_s=0)
        pool = sorted(k for k in objects if k.startswith("runs/.media/"))
        assert len(report.media) == 1 and pool == [f"runs/.media/{kept}"], (report, pool)
    finally:
        clear_store_cache()
        forget_verdicts()


@pytest.mark.parametrize("n", [999, 1_000, 1_001])
def test_a_store_verify_takes_every_size_from_its_listing_pages_at_their_boundaries(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """A pooled bundle of ``n`` media files, its pool listed in pages of LIST_PAGE (1,000): a full
    verify asks no object's size (no HEAD: every size is the listing's, kept by the media
    table's entry number), and a file missing from the last page is reported, once."""
    monkeypatch.setitem(SCHEMES, "s3", Scheme("s3", ("AWS_",), (), "nothing", store=MemoryStore))
    clear_store_cache()
    forget_verdicts()
    MemoryStore.buckets.clear()
    try:
        media = tmp_path / "media"
        media.mkdir()
        samples = []
        for i in range(n):
            (media / f"{i}.png").write_bytes(b"\x89PNG" + i.to_bytes(4, "big"))
            samples.append({"index": i, "image": str(media / f"{i}.png")})
        write_bundle("s3://mem/run/b", samples, media_roots=[media], shared_media=True)
        objects = MemoryStore.buckets["mem"]
        pool = sorted(k for k in objects if k.startswith("run/.media/"))
        assert len(pool) == n
        with open_bundle("s3://mem/run/b", verify="none") as b:
            store = b._source._prefix.store
            store.heads = 0
            assert b.problems(full=True) == []
            assert store.heads == 0
            objects.pop(pool[-1])  # the last object of the last page
            assert b.problems(full=False) == [f"s3://mem/{pool[-1]}: listed in the manifest but missing"]
    finally:
        clear_store_cache()
        forget_verdicts()


def _hash_of(store: Store, key: str, size: int) -> tuple[str, int]:
    from bundles._store.read import RangeFile

    url = store.url_of(key)
    return RangeFile(store, key, 0, size, url).sha256()


def test_an_object_hashed_as_a_stream_is_counted_and_named(store: Store) -> None:
    """A verify hashes an object as one streamed GET (``Store.read_chunks``): the bytes are
    counted, so an object shorter than its listing said is ``truncated``, and one removed since
    is ``missing``, each naming the object; on a real S3 server (moto) and through the interface's
    fallback (one range request a chunk, the in-memory backend)."""
    data = bytes(range(256)) * 4000  # ~1 MB: several 256 KiB chunks
    MemoryStore.buckets.clear()
    for backend in (store, MemoryStore("s3", "mem", None)):
        backend.put("obj", data)
        url = backend.url_of("obj")
        assert _hash_of(backend, "obj", len(data)) == (hashlib.sha256(data).hexdigest(), len(data))
        with pytest.raises(
            BundleError, match=f"^{url}: truncated: asked for {len(data) + 7} bytes, got {len(data)}"
        ):
            _hash_of(backend, "obj", len(data) + 7)
        with pytest.raises(
            BundleError, match=f"{backend.url_of('gone')}: missing \\(removed while open\\?\\)"
        ):
            _hash_of(backend, "gone", 10)
        assert _hash_of(backend, "gone", 0) == (hashlib.sha256().hexdigest(), 0)  # nothing asked
