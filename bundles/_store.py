"""The object-store client: URLs, one store per bucket, errors named by URL.

The I/O layer is obstore (Rust ``object_store``), chosen for speed (its blocking calls release the
GIL, so a few dozen threads keep that many requests in flight) and because it exposes what the commit protocol
of :mod:`bundles._remote` needs: create-only puts (``If-None-Match: *``), compare-and-swap puts
(``If-Match: <etag>``), range reads and listing. It is an optional dependency (the
``rollout-bundles[s3]`` extra) and is imported only when a URL is used.

Configuration comes the way users' other tools take it: obstore reads the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*`` and ``AZURE_*`` for the other schemes), and
``storage_options`` overrides it key by key (obstore's config names: ``endpoint``,
``access_key_id``, ``region``, ...; client options such as ``allow_http``, ``timeout``; and
``max_retries``/``retry_timeout``).

Faults. obstore retries 5xx answers, dropped connections and timeouts with exponential backoff
and jitter (here: up to :data:`DEFAULT_MAX_RETRIES` times within :data:`DEFAULT_RETRY_TIMEOUT_S`; one
request may take :data:`DEFAULT_REQUEST_TIMEOUT_S`).
Whatever is left becomes a :class:`BundleError` naming the URL: a missing bucket a
:class:`BucketNotFoundError` naming it (on reads too), a missing object a
:class:`BundleNotFoundError`, missing or refused credentials and every other failure a
:class:`BundleIOError`; obstore's multi-line debug dump is cut to its first line and the
server's error code.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from bundles._errors import (
    BucketNotFoundError,
    BundleError,
    BundleIOError,
    BundleNotFoundError,
    UnsafeBundleError,
    UnsupportedLocationError,
)
from bundles._location import STORE_EXTRA, STORE_SCHEMES

__all__ = [
    "ObjectTooLargeError",
    "Store",
    "StoreURL",
    "bucket_missing",
    "get_store",
    "parallel",
    "store_error",
]

DEFAULT_MAX_RETRIES = 5
DEFAULT_RETRY_TIMEOUT_S = 120.0
DEFAULT_REQUEST_TIMEOUT_S = 300.0
# How many requests one operation keeps in flight (uploads, downloads, deletes).
CONCURRENCY = 32
# A download into a file (Store.download_into) reads ranges of RANGE_BYTES, WINDOW_RANGES at once.
RANGE_BYTES = 8 << 20
WINDOW_RANGES = 4

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
# Options of ours, never passed to obstore: see bundles/_remote/_probe.py.
_OWN_KEYS = frozenset({"single_writer"})
# Where each scheme's endpoint comes from when storage_options do not name one.
_ENDPOINT_ENV = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "gs": ("GOOGLE_SERVICE_ENDPOINT",),
    "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", "AZURITE_BLOB_STORAGE_URL"),
}
_PART_RE = re.compile(r"[^/\x00]+")

T = TypeVar("T")


class StoreURL(str):
    """An object-store URL, ``<scheme>://<bucket>/<key>``: a ``str`` (so it prints and compares
    as the URL) with the parts a reader needs. Keys never hold empty, ``.`` or ``..`` parts (one
    trailing ``/`` is dropped: ``s3://b/x/`` is ``s3://b/x``; ``s3://b//x`` is refused)."""

    scheme: str
    bucket: str
    key: str

    def __new__(cls, text: str) -> StoreURL:
        scheme, sep, rest = text.partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in STORE_SCHEMES:
            raise UnsupportedLocationError(f"{text}: not an object-store URL ({', '.join(STORE_SCHEMES)})")
        bucket, _, raw = rest.partition("/")
        # One trailing slash names the same prefix (a directory's habit); any other empty part
        # is a key of its own on S3 ("s3://b//x" is the key "/x", not "x"), so it is refused.
        key = raw[:-1] if raw.endswith("/") else raw
        if not bucket or not _PART_RE.fullmatch(bucket):
            raise BundleError(f"{text}: expected {scheme}://<bucket>/<prefix>, found no bucket")
        parts = key.split("/") if key or raw else []
        for part in parts:
            if part in (".", "..") or not _PART_RE.fullmatch(part):
                raise BundleError(f"{text}: key parts must not be empty, '.' or '..', found {part!r}")
        self = super().__new__(cls, f"{scheme}://{bucket}/{key}" if key else f"{scheme}://{bucket}")
        self.scheme, self.bucket, self.key = scheme, bucket, key
        return self

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1] if self.key else self.bucket

    @property
    def parent(self) -> StoreURL:
        return StoreURL(f"{self.scheme}://{self.bucket}/{self.key.rpartition('/')[0]}")

    def child(self, rel: str) -> StoreURL:
        return StoreURL(f"{self}/{rel}")

    def key_of(self, rel: str) -> str:
        return f"{self.key}/{rel}" if self.key else rel

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoreURL, (str(self),))


class ObjectTooLargeError(UnsafeBundleError):
    """An object larger than the cap its reader puts on it (:meth:`Store.get` with ``max_bytes``),
    refused before its body is read."""


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


def bucket_missing(error: BaseException) -> bool:
    """The store answered that the bucket (S3, GCS) or container (Azure) does not exist."""
    text = str(error)
    return "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text


def store_error(url: object, what: str, error: BaseException) -> BundleError:
    """``error`` from obstore as the :class:`BundleError` that names ``url`` and ``what`` failed."""
    if isinstance(error, BundleError):
        return error
    obstore = _import_obstore()
    exc = obstore.exceptions
    text = str(error)
    short = _short(error)
    if bucket_missing(error):
        bucket = url.bucket if isinstance(url, StoreURL) else "?"
        scheme = url.scheme if isinstance(url, StoreURL) else "s3"
        return BucketNotFoundError(
            f"{url}: cannot {what}: the bucket {bucket!r} does not exist (create it first, e.g. "
            f"aws s3 mb {scheme}://{bucket}; see README 'On an object store')"
        )
    if isinstance(error, (exc.PermissionDeniedError, exc.UnauthenticatedError)) or _DENIED_RE.search(text):
        # A listing's 403 comes as a GenericError; say what the answer was, not obstore's text.
        return BundleIOError(
            f"{url}: cannot {what}: access denied (check the credentials) [{_answer(text, short)}]"
        )
    if (
        "/latest/api/token" in text
        or "169.254.169.254" in text
        or ("credential" in text.lower() and isinstance(error, exc.GenericError))
    ):
        return BundleIOError(
            f"{url}: cannot {what}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            f"(or pass storage_options) [{short}]"
        )
    plain = _PLAIN_HTTP_RE.search(text)
    if plain and "builder error" in text:
        # reqwest refuses an http:// endpoint unless allowed, with only "builder error" to say so.
        scheme = url.scheme if isinstance(url, StoreURL) else "s3"
        env = _ENV_PREFIX_OF.get(scheme, "AWS_") + "ALLOW_HTTP"
        return BundleIOError(
            f"{url}: cannot {what}: the endpoint {plain.group(0)} is plain http, which is refused unless "
            f"allowed: set {env}=true (or storage_options allow_http=True)"
        )
    if isinstance(error, exc.NotFoundError):
        return BundleNotFoundError(f"{url}: cannot {what}: not found")
    return BundleIOError(f"{url}: cannot {what}: {short}")


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


class Store:
    """One bucket of one store, opened with the configuration described in the module docstring.

    The methods take keys relative to the bucket and raise obstore's exceptions; callers turn
    them into a :class:`BundleError` with :func:`store_error`, since only they know which URL
    and which step to name.
    """

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
        env_http = os.environ.get(_ENV_PREFIX_OF.get(scheme, "AWS_") + "ALLOW_HTTP", "")
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
        # The endpoint as configured (None: the scheme's default service), for messages and for
        # caching what the endpoint was found to support.
        self.endpoint: str | None = config.get("endpoint") or next(
            (os.environ[k] for k in _ENDPOINT_ENV.get(scheme, ()) if os.environ.get(k)), None
        )

    # Each method is a thin wrapper: the one place that knows obstore's call shapes.
    def put(self, key: str, data: Any, mode: Any = "overwrite") -> str | None:
        result = self.obs.put(self.store, key, data, mode=mode, use_multipart=False)
        return result.get("e_tag")

    def put_create(self, key: str, data: Any) -> bool:
        """A create-only put: True when this call created the object, False when one was there
        already (obstore's ``AlreadyExistsError``, matched by name: obstore is imported lazily).
        Any other failure is raised as it is."""
        try:
            self.put(key, data, mode="create")
        except Exception as e:
            if type(e).__name__ != "AlreadyExistsError":
                raise
            return False
        return True

    def put_large(self, key: str, path: Any) -> None:
        """A multipart upload (overwrite: only for content-addressed keys, where a race writes the
        same bytes)."""
        self.obs.put(self.store, key, path, use_multipart=True, chunk_size=16 * 1024 * 1024)

    def url_of(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def get(self, key: str, max_bytes: int | None = None, cap: str = "cap") -> tuple[bytes, dict[str, Any]]:
        """The object's bytes and metadata. With ``max_bytes``, an object larger than that is
        refused with :class:`ObjectTooLargeError` (naming its URL and the reader's ``cap``) from
        the size the GET's answer declares, before its body is read: the connection is dropped
        with at most a few hundred KiB received, however large the object (a HEAD first would
        cost a request and still race a replacement). The body read is then at most that size."""
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

    def download_into(self, key: str, fd: int, size: int) -> None:
        """Write the object's ``size`` bytes at their offsets in file ``fd``, read in
        :data:`RANGE_BYTES` ranges, :data:`WINDOW_RANGES` at once (obstore parallelises the ranges
        of one call), each window written before the next is asked for: at most
        ``RANGE_BYTES * WINDOW_RANGES`` (32 MiB) of the object is in memory, whatever its size.
        A range shorter than asked (the object replaced meanwhile) is an :class:`UnsafeBundleError`."""
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

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self.obs.get_range(self.store, key, start=start, end=end))

    def get_ranges(self, key: str, starts: list[int], ends: list[int]) -> list[bytes]:
        return [bytes(b) for b in self.obs.get_ranges(self.store, key, starts=starts, ends=ends)]

    def get_ranges_buffers(self, key: str, starts: list[int], ends: list[int]) -> list[Any]:
        """:meth:`get_ranges` without the copy: obstore's buffers (each supports ``memoryview``)."""
        return list(self.obs.get_ranges(self.store, key, starts=starts, ends=ends))

    def head(self, key: str) -> dict[str, Any] | None:
        try:
            return dict(self.obs.head(self.store, key))
        except FileNotFoundError:
            return None

    def listing(self, prefix: str) -> list[dict[str, Any]]:
        """Every object under ``prefix/`` (recursive), with ``path`` relative to the bucket."""
        found: list[dict[str, Any]] = []
        stream = self.obs.list(self.store, prefix.rstrip("/") + "/" if prefix else None, chunk_size=1000)
        for batch in stream:
            found.extend(dict(m) for m in batch)
        return found

    def children(self, prefix: str) -> list[str]:
        """The names right under ``prefix/`` that have objects below them ("directories")."""
        result = self.obs.list_with_delimiter(self.store, prefix.rstrip("/") + "/" if prefix else None)
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]]

    def files(self, prefix: str) -> list[str]:
        """The names of the objects right under ``prefix/`` (one level, not below)."""
        result = self.obs.list_with_delimiter(self.store, prefix.rstrip("/") + "/" if prefix else None)
        return [str(m["path"]).rsplit("/", 1)[-1] for m in result["objects"]]

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            self.obs.delete(self.store, keys[i : i + 1000])


_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")
_ENV_PREFIX_OF = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_"}
_stores: dict[tuple[Any, ...], Store] = {}
_stores_lock = threading.Lock()


def get_store(url: StoreURL, options: Mapping[str, Any] | None = None) -> Store:
    """The :class:`Store` of ``url``'s bucket: one per bucket and configuration, so that its
    connection pool is reused; a change of the ``AWS_*``/``GOOGLE_*``/``AZURE_*`` environment makes a new one."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
    key = (url.scheme, url.bucket, tuple(sorted((k, repr(v)) for k, v in (options or {}).items())), env)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = Store(url.scheme, url.bucket, options)
        return store


def clear_store_cache() -> None:
    """Forget every :class:`Store` (the next use reads the environment again)."""
    with _stores_lock:
        _stores.clear()
