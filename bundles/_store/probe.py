"""Does a store honour the preconditions the commit protocol rests on? Asked before the first commit.

Publishing a bundle (FORMAT.md §9) is one conditional put: create-only (``If-None-Match: *``)
for a new bundle, compare-and-swap (``If-Match: <etag>``) to replace one. A server that ignores
those headers answers both with 200: two writers racing for one destination are both told they
published, and one bundle silently replaces the other. Such servers are in use (s3rver, rclone's
``serve s3``, older MinIO and SeaweedFS releases, a proxy that drops the headers), and nothing in
their answers tells them apart from one that honours the headers, so the writer asks.

The probe, run once per process for each endpoint and bucket before the first commit there,
under the destination's parent prefix (where the writer is known to be allowed to write):

1. a create-only put of a fresh key ``.rollout-bundle-probe-<random>`` (must succeed);
2. a second create-only put of that key (must fail: "already exists");
3. a put with ``If-Match`` on an ETag the object cannot have (must fail: "precondition");
4. a delete of the key (best effort: the key is named so that gc never takes it for a bundle).

Four small requests, once: on loopback about 5 ms. A store that ignores either precondition is
refused with :class:`UnsafeStoreError`, naming the endpoint, the bucket and what was ignored. A
deployment where only one process ever writes a bucket can opt in with ``single_writer=True`` in
``storage_options`` or ``ROLLOUT_BUNDLE_SINGLE_WRITER=1`` in the environment (the way a trainer
started from a command line can give it): the probe still runs, the refusal becomes a warning,
and two racing writers are then the deployment's responsibility.

The answer is cached per process, not on the store (a server may be upgraded or replaced behind
one endpoint, and a marker object left in the bucket would be believed long after that), and for
:data:`VERDICT_TTL_S` only: a long-running writer asks again now and then. Between two probes a
store may still start dropping the headers (a proxy reconfigured in front of it); each writer
therefore reads its pointer back after putting it (``bundles._store.write._confirm``), which
tells the writer whose put was overtaken that it lost. FORMAT.md §9 says what neither can see.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
import warnings

from bundles._errors import BundleError, UnsafeStoreError, UnsafeStoreWarning, stacklevel_outside_bundles
from bundles._store.client import Store, naming
from bundles._urls import SINGLE_WRITER_ENV, StoreURL

__all__ = ["SINGLE_WRITER_ENV", "check_preconditions", "forget_verdicts"]

PROBE_PREFIX = ".rollout-bundle-probe-"
# An ETag no object can have: S3 ETags are quoted hex digests; this one is not hex.
_WRONG_ETAG = '"rollout-bundle-probe-no-such-etag"'

#: How long one probe's verdict is trusted (seconds of ``time.monotonic``).
VERDICT_TTL_S = 600.0

_verdicts: dict[tuple[str, str, str], tuple[list[str], float]] = {}
_lock = threading.Lock()


def _ignored(store: Store, key: str) -> list[str]:
    """Run the probe at ``key``; return what the store ignored (empty when it honours both)."""
    ignored: list[str] = []
    if not store.put_create(key, b"probe 1"):
        # A fresh random key already there: someone else's object, not a verdict. Fail closed.
        raise BundleError(f"{store.url_of(key)}: the probe key exists already")
    try:
        if store.put_create(key, b"probe 2"):
            ignored.append("If-None-Match: * (a second create-only put of one key succeeded)")
        if store.put_swap(key, b"probe 3", _WRONG_ETAG):
            ignored.append("If-Match (a put with a wrong ETag succeeded)")
    finally:
        # Best effort: the probe's name keeps it out of every bundle and gc listing.
        with contextlib.suppress(Exception):
            store.delete([key])
    return ignored


def endpoint_of(store: Store) -> str:
    """The endpoint a store talks to, as a person would name it."""
    endpoint = store.endpoint
    return endpoint or f"the default {store.scheme}:// endpoint"


def single_writer_opt_in(store: Store) -> bool:
    env = os.environ.get(SINGLE_WRITER_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return env or store.single_writer


def check_preconditions(store: Store, url: StoreURL) -> None:
    """Refuse to commit to ``url`` when its store ignores the preconditions (module docstring)."""
    cache_key = (store.scheme, store.endpoint or "", store.bucket)
    with _lock:
        cached = _verdicts.get(cache_key)
    ignored = cached[0] if cached is not None and time.monotonic() - cached[1] < VERDICT_TTL_S else None
    if ignored is None:
        name = PROBE_PREFIX + secrets.token_hex(8)
        parent = url.key.rpartition("/")[0]
        key = f"{parent}/{name}" if parent else name
        with naming(url, "probe the store's conditional puts"):
            ignored = _ignored(store, key)
        with _lock:
            _verdicts[cache_key] = (ignored, time.monotonic())
    if not ignored:
        return
    what = " and ".join(ignored)
    where = f"{store.scheme}://{store.bucket} at {endpoint_of(store)}"
    if single_writer_opt_in(store):
        warnings.warn(
            f"{where} ignores {what}; writing anyway (single-writer opt-in): two writers racing for "
            f"one bundle would both publish",
            UnsafeStoreWarning,
            stacklevel=stacklevel_outside_bundles(),
        )
        return
    raise UnsafeStoreError(
        f"{where}: the store ignores {what}, so two writers racing for one bundle would both "
        f"publish; refusing to commit to {url}. If only one process ever writes there, set "
        f"{SINGLE_WRITER_ENV}=1 (or storage_options={{'single_writer': True}})"
    )


def forget_verdicts() -> None:
    """Forget every probe result (tests; a store replaced behind an endpoint)."""
    with _lock:
        _verdicts.clear()
