"""The object-store client: URLs, the :class:`Store` interface, its obstore implementation.

A *store* is one bucket (or container) behind a client. :class:`Store` is the interface the
protocol of :mod:`bundles._store` is written against: create-only puts (``If-None-Match: *``),
compare-and-swap puts (``If-Match: <etag>``), bounded GETs, range reads, heads, listings,
deletes. Its methods take keys relative to the bucket and raise only :class:`BundleError`
subclasses, each naming the object's URL and the operation (below): no caller translates a
client's exceptions. "Not found" is a value where a caller needs one (:meth:`Store.head` returns
None, :meth:`Store.put_create` False, :meth:`Store.put_swap` False) or the one class
:class:`ObjectNotFoundError`.

:class:`ObstoreStore` implements it with obstore (Rust ``object_store``), chosen for speed (its
blocking calls release the GIL, so a few dozen threads keep that many requests in flight) and
because it exposes the preconditions above. It is an optional dependency (the
``rollout-bundles[s3]`` extra) and is imported only when a URL is used. What each scheme means
(its environment, the class that serves it) is the one table :data:`bundles._urls.SCHEMES`; serving another
scheme or another client is one :class:`Store` subclass and one row.

Configuration comes the way users' other tools take it: obstore reads the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*`` and ``AZURE_*`` for the other schemes), and
``storage_options`` overrides it key by key (obstore's config names: ``endpoint``,
``access_key_id``, ``region``, ...; client options such as ``allow_http``, ``timeout``; and
``max_retries``/``retry_timeout``).

Faults. obstore retries 5xx answers, dropped connections and timeouts with exponential backoff
and jitter (here: up to :data:`DEFAULT_MAX_RETRIES` times within :data:`DEFAULT_RETRY_TIMEOUT_S`; one
request may take :data:`DEFAULT_REQUEST_TIMEOUT_S`).
Whatever is left becomes a :class:`BundleError` naming the URL and the operation
(``<url>: cannot <operation>: <reason>``): a missing bucket a :class:`BucketNotFoundError` naming
it (on reads too), a missing object an :class:`ObjectNotFoundError` (``<url>: not found``),
refused credentials a :class:`StoreAccessDeniedError`, missing credentials and every other
failure a :class:`BundleIOError`; obstore's multi-line debug dump is cut to its first line and
the server's error code. A caller whose reader knows the failure by a larger name (the bundle,
not one of its objects) says so with :func:`naming`, which keeps the class and the reason.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import datetime
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from bundles._errors import (
    BundleError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectTooLargeError,
    StoreAccessDeniedError,
    StoreBucketNotFoundError,
    StoreIOError,
    UnsafeBundleError,
    UnsupportedLocationError,
)
from bundles._urls import SCHEMES, STORE_EXTRA, StoreURL

__all__ = [
    "ObstoreStore",
    "Store",
    "get_store",
    "naming",
    "parallel",
]

DEFAULT_MAX_RETRIES = 5
DEFAULT_RETRY_TIMEOUT_S = 120.0
DEFAULT_REQUEST_TIMEOUT_S = 300.0
# How many requests one operation keeps in flight (uploads, downloads, deletes).
CONCURRENCY = 32
# A download into a file (Store.download_into) reads ranges of RANGE_BYTES, WINDOW_RANGES at once.
RANGE_BYTES = 8 << 20
WINDOW_RANGES = 4
# Objects a listing page holds (Store.listing_pages; obstore's chunk_size).
LIST_PAGE = 1000
T = TypeVar("T")


def _failure(cls: type[BundleError], url: object, what: str, reason: str) -> BundleError:
    """``cls("<url>: cannot <what>: <reason>")`` that remembers its reason, for :func:`naming`."""
    error = cls(f"{url}: cannot {what}: {reason}")
    error.store_reason = reason  # type: ignore[attr-defined]
    return error


def _named(error: BundleError, url: object, what: str) -> BundleError:
    """``error`` said as a failure to ``what`` at ``url``; named once: an outer :func:`naming`
    leaves it as it is."""
    renamed = type(error)(f"{url}: cannot {what}: {error.store_reason}")  # type: ignore[attr-defined]
    return renamed


@contextlib.contextmanager
def naming(url: object, what: str) -> Iterator[None]:
    """Inside, a store's failure (a :class:`BundleError` of :class:`Store`'s) is said as a failure
    to ``what`` at ``url``, the name its reader knows (the bundle rather than one of its
    objects): ``<url>: cannot <what>: <reason>``, the same class, the object's error as
    ``__cause__``. Every other exception passes unchanged, and so does a failure named already
    (by a :func:`naming` inside this one)."""
    try:
        yield
    except BundleError as e:
        if getattr(e, "store_reason", None) is None:
            raise
        raise _named(e, url, what) from e


def parallel(fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
    """``[fn(x) for x in items]`` with up to :data:`CONCURRENCY` calls in flight, in order; the
    first exception (in item order) is raised once every call has finished.

    Threads, not asyncio: obstore's blocking calls release the GIL, and its async calls, driven
    by a short-lived ``asyncio.run`` loop, made the interpreter abort at exit now and then (a
    tokio thread waking a closed loop during finalization)."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(min(CONCURRENCY, len(items))) as pool:
        futures = [pool.submit(fn, x) for x in items]
        concurrent.futures.wait(futures)
    return [f.result() for f in futures]


class Store(abc.ABC):
    """One bucket of one store: what the protocol of :mod:`bundles._store` asks of a client.

    Keys are relative to the bucket. Every method raises only :class:`BundleError` subclasses,
    naming the object's URL and the operation (module docstring); a subclass translates its
    client's errors once, in itself. ``metadata`` dicts carry at least ``size`` and ``e_tag``
    (None where the store has none), ``last_modified`` and, in a listing, ``path``."""

    scheme: str
    bucket: str
    #: The endpoint as configured (None: the scheme's default service), for messages and for
    #: caching what the endpoint was found to support.
    endpoint: str | None
    #: The single-writer opt-in of ``storage_options`` (:mod:`bundles._store.probe`).
    single_writer: bool

    def url_of(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}" if key else f"{self.scheme}://{self.bucket}"

    # -- writes ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: bytes | bytearray | memoryview) -> str | None:
        """Store ``data`` at ``key``, replacing what is there; the new object's ETag."""

    @abc.abstractmethod
    def put_new(self, key: str, data: bytes | bytearray | memoryview) -> str | None:
        """A create-only put (``If-None-Match: *``); the new object's ETag.
        :class:`ObjectExistsError` when an object is there already (it is left as it was)."""

    def put_create(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        """A create-only put: True when this call created the object, False when one was there."""
        try:
            self.put_new(key, data)
        except ObjectExistsError:
            return False
        return True

    @abc.abstractmethod
    def put_swap(self, key: str, data: bytes | bytearray | memoryview, etag: str | None) -> bool:
        """A compare-and-swap put (``If-Match: <etag>``): True when the object had ``etag`` and
        now holds ``data``; False when it had another (or none), and is left as it was."""

    @abc.abstractmethod
    def put_large(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload the file at ``path`` in parts (overwrite: only for content-addressed keys,
        where a race writes the same bytes)."""

    @abc.abstractmethod
    def delete(self, keys: list[str]) -> None:
        """Delete these objects (absent ones are no error)."""

    # -- reads -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def get(self, key: str, max_bytes: int | None = None, cap: str = "cap") -> tuple[bytes, dict[str, Any]]:
        """The object's bytes and metadata. With ``max_bytes``, an object larger than that is
        refused with :class:`ObjectTooLargeError` (naming its URL and the reader's ``cap``)
        before its body is read. :class:`ObjectNotFoundError` when there is none."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (fewer where it is shorter)."""

    @abc.abstractmethod
    def get_ranges_buffers(self, key: str, starts: list[int], ends: list[int]) -> list[Any]:
        """The ranges ``[starts[i], ends[i])`` of one object, as buffers (each supports ``memoryview``)."""

    def read_chunks(self, key: str, start: int, end: int, chunk: int) -> Iterator[Any]:
        """Bytes ``[start, end)`` of the object as buffers of about ``chunk`` bytes, each taken
        before the next is asked for (for hashing an object without holding it: see
        ``_StoreSourceBase.hash``). Here, one range request a chunk; a client that streams one
        answer does better (:class:`ObstoreStore`). Fewer bytes than asked where the object is
        shorter: the caller counts them."""
        at = start
        while at < end:
            data = self.get_range(key, at, min(at + chunk, end))
            if not data:
                return
            yield data
            at += len(data)

    def get_ranges(self, key: str, starts: list[int], ends: list[int]) -> list[bytes]:
        return [bytes(b) for b in self.get_ranges_buffers(key, starts, ends)]

    @abc.abstractmethod
    def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata; None when there is none."""

    @abc.abstractmethod
    def listing(self, prefix: str) -> list[dict[str, Any]]:
        """Every object under ``prefix/`` (recursive), with ``path`` relative to the bucket."""

    def listing_pages(self, prefix: str) -> Iterator[list[tuple[str, int]]]:
        """What :meth:`listing` lists, as ``(path, size)`` pages of at most :data:`LIST_PAGE`
        objects, each asked for as the one before is taken: a reader that keeps only some of
        the objects (a bundle's, of a media pool shared with others) holds one page at a time,
        not the whole prefix (issue 39, item 6). Errors as :meth:`listing`'s, raised where the
        page that failed is asked for."""
        found = self.listing(prefix)  # a client without pages: one page (the fallback)
        for i in range(0, len(found), LIST_PAGE):
            yield [(str(m["path"]), int(m["size"])) for m in found[i : i + LIST_PAGE]]

    @abc.abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names right under ``prefix/`` that have objects below them ("directories")."""

    @abc.abstractmethod
    def files(self, prefix: str) -> list[str]:
        """The names of the objects right under ``prefix/`` (one level, not below)."""

    def download_into(self, key: str, fd: int, size: int) -> None:
        """Write the object's ``size`` bytes at their offsets in file ``fd``, read in
        :data:`RANGE_BYTES` ranges, :data:`WINDOW_RANGES` at once, each window written before the
        next is asked for: at most ``RANGE_BYTES * WINDOW_RANGES`` (32 MiB) of the object is in
        memory, whatever its size. A range shorter than asked (the object replaced meanwhile) is
        an :class:`UnsafeBundleError`; the local file's refusal is its ``OSError``, raised as it is
        (not a :class:`BundleError`: the caller names its file)."""
        window = RANGE_BYTES * WINDOW_RANGES
        for first in range(0, size, window):
            starts = list(range(first, min(first + window, size), RANGE_BYTES))
            ends = [min(start + RANGE_BYTES, size) for start in starts]
            chunks = self.get_ranges_buffers(key, starts, ends)
            for start, end, chunk in zip(starts, ends, chunks, strict=True):
                view = memoryview(chunk)
                if view.nbytes != end - start:
                    raise UnsafeBundleError(f"{self.url_of(key)}: the object changed while it was read")
                at = start
                while view:
                    n = os.pwrite(fd, view, at)
                    view, at = view[n:], at + n
            del chunks, chunk, view


# -- obstore -------------------------------------------------------------------------------------
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "timeout",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "http1_only",
        "http2_only",
        "user_agent",
        "proxy_url",
    }
)
_RETRY_KEYS = frozenset({"max_retries", "retry_timeout"})
# Options of ours, never passed to obstore: see bundles/_store/probe.py.
_OWN_KEYS = frozenset({"single_writer"})


def _import_obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise UnsupportedLocationError(
            f"object-store URLs need the optional dependency obstore: pip install '{STORE_EXTRA}'"
        ) from None
    return obstore


def _short(error: BaseException) -> str:
    """obstore's message without its debug dump: the first line, with the server's XML error
    body reduced to its code and message."""
    text = str(error).split("\n\nDebug source", 1)[0].strip()
    code = re.search(r"<Code>([^<]{1,64})</Code>", text)
    text = re.sub(r":? ?<\?xml.*", "", text, flags=re.S).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    return f"{text} ({code.group(1)})" if code else text


# A refusal of the request's credentials, as the stores word it in any error class.
_DENIED_RE = re.compile(
    r"status code: 40[13] |\((?:SignatureDoesNotMatch|InvalidAccessKeyId|AccessDenied|AuthorizationFailure|"
    r"AuthenticationFailed|InvalidAuthenticationInfo)\)|<Code>(?:SignatureDoesNotMatch|InvalidAccessKeyId|"
    r"AccessDenied|AuthorizationFailure|AuthenticationFailed)</Code>"
)
_PLAIN_HTTP_RE = re.compile(r"http://[^/\s]+")
_ANSWER_RE = re.compile(r"status code: (\d{3}[^(\n]*?)\s*(\([A-Za-z]{1,64}\))?\s*$", re.M)


def _answer(text: str, short: str) -> str:
    """The server's answer in a few words (``403 Forbidden (SignatureDoesNotMatch)``), else ``short``."""
    m = _ANSWER_RE.search(short) or _ANSWER_RE.search(text)
    if m is None:
        return short
    return f"{m.group(1).strip()} {m.group(2)}" if m.group(2) else m.group(1).strip()


def _bucket_missing(error: BaseException) -> bool:
    """The store answered that the bucket (S3, GCS) or container (Azure) does not exist."""
    text = str(error)
    return "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text


def _translate(store: ObstoreStore, key: str, what: str, error: BaseException) -> BundleError:
    """``error`` from obstore, met doing ``what`` at ``key``, as the :class:`BundleError` that
    names the object's URL and the operation: the one place obstore's exceptions are read."""
    if isinstance(error, BundleError):
        return error
    url = store.url_of(key)
    exc = store.obs.exceptions
    text = str(error)
    short = _short(error)
    if _bucket_missing(error):
        return _failure(
            StoreBucketNotFoundError,
            url,
            what,
            f"the bucket {store.bucket!r} does not exist (create it first, e.g. "
            f"aws s3 mb {store.scheme}://{store.bucket}; see README 'On an object store')",
        )
    if isinstance(error, (exc.PermissionDeniedError, exc.UnauthenticatedError)) or _DENIED_RE.search(text):
        # A listing's 403 comes as a GenericError; say what the answer was, not obstore's text.
        return _failure(
            StoreAccessDeniedError,
            url,
            what,
            f"access denied (check the credentials) [{_answer(text, short)}]",
        )
    if (
        "/latest/api/token" in text
        or "169.254.169.254" in text
        or ("credential" in text.lower() and isinstance(error, exc.GenericError))
    ):
        return _failure(
            StoreIOError,
            url,
            what,
            f"no credentials: set {SCHEMES[store.scheme].credentials} (or pass storage_options) [{short}]",
        )
    plain = _PLAIN_HTTP_RE.search(text)
    if plain and "builder error" in text:
        # reqwest refuses an http:// endpoint unless allowed, with only "builder error" to say so.
        return _failure(
            StoreIOError,
            url,
            what,
            f"the endpoint {plain.group(0)} is plain http, which is refused unless allowed: set "
            f"{SCHEMES[store.scheme].allow_http_env}=true (or storage_options allow_http=True)",
        )
    if isinstance(error, (exc.NotFoundError, FileNotFoundError)):  # obstore raises the builtin
        found = ObjectNotFoundError(f"{url}: not found")
        found.store_reason = "not found"  # type: ignore[attr-defined]
        return found
    if isinstance(error, OSError) and not type(error).__module__.startswith("obstore"):
        return _failure(StoreIOError, url, what, f"{error.strerror or error}")
    return _failure(StoreIOError, url, what, short)


class ObstoreStore(Store):
    """:class:`Store` by obstore, opened with the configuration described in the module docstring."""

    def __init__(self, scheme: str, bucket: str, options: Mapping[str, Any] | None) -> None:
        self.obs = _import_obstore()
        from obstore.store import from_url

        config: dict[str, Any] = {}
        self.single_writer = bool((options or {}).get("single_writer", False))
        # obstore's default request timeout (30 s) fails a 16 MiB part on a slow or busy link.
        client: dict[str, Any] = {"timeout": f"{DEFAULT_REQUEST_TIMEOUT_S:g}s", "connect_timeout": "10s"}
        retry: dict[str, Any] = {
            "max_retries": DEFAULT_MAX_RETRIES,
            "retry_timeout": datetime.timedelta(seconds=DEFAULT_RETRY_TIMEOUT_S),
            "backoff": {
                "init_backoff": datetime.timedelta(milliseconds=50),
                "max_backoff": datetime.timedelta(seconds=2),
                "base": 2,
            },
        }
        for key, value in (options or {}).items():
            if key in _OWN_KEYS:
                continue
            if key in _CLIENT_KEYS:
                client[key] = value
            elif key == "retry_timeout":
                retry[key] = datetime.timedelta(seconds=float(value))
            elif key in _RETRY_KEYS:
                retry[key] = value
            else:
                config[key] = value
        # Explicit client options replace the ones obstore reads from the environment: keep
        # AWS_ALLOW_HTTP (and its GCS/Azure peers) working.
        env_http = os.environ.get(SCHEMES[scheme].allow_http_env, "")
        if "allow_http" not in client and env_http.strip().lower() in ("1", "true", "yes", "on"):
            client["allow_http"] = True
        where = f"{scheme}://{bucket}"
        try:
            make: Any = from_url  # its overloads are per scheme, known only at run time
            self.store = make(where, config=config or None, client_options=client or None, retry_config=retry)
        except Exception as e:
            raise BundleError(f"{where}: cannot configure the store: {_short(e)}") from None
        self.scheme = scheme
        self.bucket = bucket
        self.endpoint = config.get("endpoint") or next(
            (os.environ[k] for k in SCHEMES[scheme].endpoint_env if os.environ.get(k)), None
        )

    @contextlib.contextmanager
    def _doing(self, what: str, key: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            raise _translate(self, key, what, e) from e

    @staticmethod
    def _dir(prefix: str) -> str | None:
        return prefix.rstrip("/") + "/" if prefix else None

    # Each method is a thin wrapper: the one place that knows obstore's call shapes and errors.
    def put(self, key: str, data: bytes | bytearray | memoryview) -> str | None:
        with self._doing("write the object", key):
            result = self.obs.put(self.store, key, data, mode="overwrite", use_multipart=False)
        return result.get("e_tag")

    def put_new(self, key: str, data: bytes | bytearray | memoryview) -> str | None:
        try:
            result = self.obs.put(self.store, key, data, mode="create", use_multipart=False)
        except self.obs.exceptions.AlreadyExistsError:
            raise ObjectExistsError(f"{self.url_of(key)}: exists already (a create-only put)") from None
        except Exception as e:
            raise _translate(self, key, "create the object", e) from e
        return result.get("e_tag")

    def put_swap(self, key: str, data: bytes | bytearray | memoryview, etag: str | None) -> bool:
        exc = self.obs.exceptions
        try:
            self.obs.put(self.store, key, data, mode={"e_tag": etag}, use_multipart=False)
        except (exc.PreconditionError, exc.AlreadyExistsError, exc.NotModifiedError):
            return False
        except Exception as e:
            raise _translate(self, key, "replace the object", e) from e
        return True

    def put_large(self, key: str, path: str | os.PathLike[str]) -> None:
        with self._doing("write the object", key):
            self.obs.put(self.store, key, path, use_multipart=True, chunk_size=16 * 1024 * 1024)

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            with self._doing(f"delete {len(keys[i : i + 1000])} object(s)", keys[i]):
                self.obs.delete(self.store, keys[i : i + 1000])

    def get(self, key: str, max_bytes: int | None = None, cap: str = "cap") -> tuple[bytes, dict[str, Any]]:
        """See :meth:`Store.get`. The cap is applied to the size the GET's answer declares, before
        its body is read: the connection is dropped with at most a few hundred KiB received,
        however large the object (a HEAD first would cost a request and still race a replacement)."""
        with self._doing("read the object", key):
            result = self.obs.get(self.store, key)
            meta = dict(result.meta)
            if max_bytes is not None:
                size = int(meta.get("size") or 0)
                if size > max_bytes:
                    del result  # drops the answer's body unread
                    raise ObjectTooLargeError(
                        f"{self.url_of(key)}: {size} bytes exceeds the {cap} of {max_bytes} bytes"
                    )
            data = bytes(result.bytes())
        if max_bytes is not None and len(data) > max_bytes:  # never with a Content-Length, but cheap
            raise ObjectTooLargeError(
                f"{self.url_of(key)}: {len(data)} bytes exceeds the {cap} of {max_bytes} bytes"
            )
        return data, meta

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._doing("read", key):
            return bytes(self.obs.get_range(self.store, key, start=start, end=end))

    def read_chunks(self, key: str, start: int, end: int, chunk: int) -> Iterator[Any]:
        # One GET of the range, its body taken in chunks of ``chunk`` bytes as they arrive: the
        # buffers are small and short-lived (range reads of 2 MiB left 2 MiB blocks in each
        # thread's malloc arena, glibc raising its mmap threshold to the size of a freed block:
        # a store verify of 2,000 screenshots peaked 57.6 MB with them, 51.8 streamed; issue 39).
        if start >= end:
            return
        with self._doing("read", key):
            result = self.obs.get(self.store, key, options={"range": (start, end)})
            stream = result.stream(min_chunk_size=chunk)
            del result
        while True:
            with self._doing("read", key):
                buf = next(stream, None)
            if buf is None:
                return
            yield buf
            del buf

    def get_ranges_buffers(self, key: str, starts: list[int], ends: list[int]) -> list[Any]:
        with self._doing("read", key):
            return list(self.obs.get_ranges(self.store, key, starts=starts, ends=ends))

    def head(self, key: str) -> dict[str, Any] | None:
        try:
            return dict(self.obs.head(self.store, key))
        except (self.obs.exceptions.NotFoundError, FileNotFoundError) as e:
            if _bucket_missing(e):
                raise _translate(self, key, "look up the object", e) from e
            return None
        except Exception as e:
            raise _translate(self, key, "look up the object", e) from e

    def listing(self, prefix: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        with self._doing("list", prefix):
            for batch in self.obs.list(self.store, self._dir(prefix), chunk_size=LIST_PAGE):
                found.extend(dict(m) for m in batch)
        return found

    def listing_pages(self, prefix: str) -> Iterator[list[tuple[str, int]]]:
        # obstore asks for the next page as the iterator is advanced; a failure of any page is
        # translated here, as listing's is (the consumer's own errors never pass through here).
        # Neither obstore's page (a dict an object, ~900 bytes) nor ours is still referenced here
        # while the next is fetched: a loop variable would keep one until it is reassigned.
        with self._doing("list", prefix):
            for batch in self.obs.list(self.store, self._dir(prefix), chunk_size=LIST_PAGE):
                page = [(str(m["path"]), int(m["size"])) for m in batch]
                del batch
                yield page
                del page

    def children(self, prefix: str) -> list[str]:
        with self._doing("list", prefix):
            result = self.obs.list_with_delimiter(self.store, self._dir(prefix))
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]]

    def files(self, prefix: str) -> list[str]:
        with self._doing("list", prefix):
            result = self.obs.list_with_delimiter(self.store, self._dir(prefix))
        return [str(m["path"]).rsplit("/", 1)[-1] for m in result["objects"]]


_stores: dict[tuple[Any, ...], Store] = {}
_stores_lock = threading.Lock()


def get_store(url: StoreURL, options: Mapping[str, Any] | None = None) -> Store:
    """The :class:`Store` of ``url``'s bucket, of the class its scheme's row in :data:`SCHEMES`
    names: one per bucket and configuration, so that its connection pool is reused; a change of
    the schemes' environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) makes a new one."""
    prefixes = tuple(p for row in SCHEMES.values() for p in row.env_prefixes)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))
    key = (url.scheme, url.bucket, tuple(sorted((k, repr(v)) for k, v in (options or {}).items())), env)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            served_by = SCHEMES[url.scheme].store
            cls: Any = globals()[served_by] if isinstance(served_by, str) else served_by
            store = _stores[key] = cls(url.scheme, url.bucket, options)
        return store


def clear_store_cache() -> None:
    """Forget every :class:`Store` (the next use reads the environment again)."""
    with _stores_lock:
        _stores.clear()
