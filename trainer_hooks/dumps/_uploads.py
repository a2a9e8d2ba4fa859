"""Background uploads of debug dumps to an object store (``--save-debug-rollout-data s3://...``).

A dump to a URL costs the rollout loop what a local dump costs today: the bundle is written (or
packed) locally, in a scratch directory beside the run's media directory, so media are hard
links, not copies; its upload is then queued on one worker thread (uploads complete in call
order) and the call returns. The scratch copy shares nothing with the run directory but inodes,
so releasing the run's media never touches a queued upload; :func:`flush_dump_uploads` waits for
them and raises the first failure (each failure is raised once). The drivers call it in the
disposer's flush slot, before ``release_run_media``; the worker is a non-daemon thread, so a
normal interpreter exit waits for queued uploads too. A failed upload leaves nothing visible at
its URL (bundles' commit protocol, docs/FORMAT.md §9).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from bundles import BundleError

__all__ = ["DumpUploadError", "flush_dump_uploads", "queue_upload"]

logger = logging.getLogger(__name__)


class DumpUploadError(BundleError):
    """A background upload of a debug dump failed; ``__cause__`` holds the original error."""


_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_queued: list[tuple[str, Future[None]]] = []


def _run(url: str, publish: Callable[[], object]) -> None:
    try:
        publish()
        logger.info("debug dump uploaded to %s", url)
    except BaseException as e:
        logger.error("background upload of the debug dump %s failed: %s: %s", url, type(e).__name__, e)
        raise


def queue_upload(url: str, publish: Callable[[], object]) -> Future[None]:
    """Run ``publish()`` (a :meth:`bundles.Staged.publish`, which removes its local copy whatever
    happens) on the upload thread."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dump-upload")
        fut = _executor.submit(_run, url, publish)
        _queued.append((url, fut))
    return fut


def flush_dump_uploads() -> list[str]:
    """Wait for every queued dump upload; raise :class:`DumpUploadError` for the first that
    failed (the others are still waited for). Returns the URLs uploaded since the last flush."""
    with _lock:
        queued = list(_queued)
        _queued.clear()
    done: list[str] = []
    first: tuple[str, BaseException] | None = None
    for url, fut in queued:
        exc = fut.exception()
        if exc is None:
            done.append(url)
        elif first is None:
            first = (url, exc)
    if first is not None:
        url, exc = first
        raise DumpUploadError(
            f"{url}: background upload of the debug dump failed: {type(exc).__name__}: {exc}"
        ) from exc
    return done
