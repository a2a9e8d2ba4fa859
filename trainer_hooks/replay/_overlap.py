"""The cast and the fingerprints of a replay, on one worker thread: :class:`PixelWorker`.

A replay (:mod:`trainer_hooks.replay._run`) keeps none of the tensors it rebuilds: of each
image's ``pixel_values`` it needs only the bytes after the cast to the training dtype, as their
sha256 (the fingerprint) and their size. Both steps are C loops that release the GIL
(``Tensor.copy_`` and ``hashlib.sha256`` over a buffer), about 20 ms per 1080p screenshot, so a
worker thread does them while the calling thread decodes the next image and runs the processor
on it (issue 25 row 6).

The trade-off is memory for time, bounded: :meth:`PixelWorker.submit` first waits for the job
before it, so at most one image is in flight. While the processor works on image k+1, image k's
float32 ``pixel_values`` (50.6 MB for a 1080p screenshot) are still alive until the worker has
cast them; the cast goes into one buffer the worker reuses for every image (the size of the
largest image so far, 25.3 MB in bf16), freed by :meth:`PixelWorker.close`. Nothing else is
held: no concatenation of a sample's images, no cast copy per image. Without a spare core the
overlap gains nothing and costs nothing but that memory.

The results are the sequential path's bit for bit: ``copy_`` into the buffer is the kernel
``Tensor.to`` runs, and the digest covers the same bytes (tests/test_replay_overlap.py compares
both with :func:`~trainer_hooks.replay._rebuild.compute_multimodal_train_inputs` and
:func:`~trainer_hooks.replay._fingerprint.fingerprints`). ``overlap=False`` runs the same jobs on
the calling thread, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from trainer_hooks.replay._fingerprint import tensor_fingerprint
from trainer_hooks.replay._memory import release_freed_memory

__all__ = ["PixelResult", "PixelWorker"]

#: Per grid row of one image: the ``pixel_values`` fingerprint; and the bytes after the cast.
PixelResult = tuple[list[dict[str, Any]], int]


def _wait(job: Future[PixelResult]) -> PixelResult:
    return job.result()


class PixelWorker:
    """Casts one image's ``pixel_values`` to a dtype and fingerprints them, one image at a time,
    on a thread of its own (``overlap=True``) or on the caller's. A context manager: leaving it
    waits for the last job and ends the thread, also on an exception."""

    def __init__(self, overlap: bool = True) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="replay-pixels") if overlap else None
        self._last: Future[PixelResult] | None = None
        self._buffer: Any = None  # 1-D, the training dtype, grown to the largest image

    def __enter__(self) -> PixelWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self, holder: list[Any], dtype: Any, patches: Sequence[int], *, trim: bool = False
    ) -> Future[PixelResult]:
        """Cast the tensor in ``holder`` (popped: the caller keeps no reference, so the float32
        original is freed on the worker as soon as it is cast) to ``dtype`` and fingerprint its
        rows in runs of ``patches`` (one per grid row); ``trim``: :func:`release_freed_memory`
        after (a sample's last image). Waits for the job before it: one image in flight."""
        if self._last is not None:
            _wait(self._last)
        job: Callable[[], PixelResult] = lambda: self._cast_and_fingerprint(holder, dtype, patches, trim)  # noqa: E731
        if self._pool is None:
            done: Future[PixelResult] = Future()
            try:
                done.set_result(job())
            except BaseException as e:  # as a worker's failure: raised by result()
                done.set_exception(e)
            self._last = done
        else:
            self._last = self._pool.submit(job)
        return self._last

    def close(self) -> None:
        """Wait for the last job and end the thread; frees the cast buffer. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._last = None
        self._buffer = None

    def _cast_and_fingerprint(
        self, holder: list[Any], dtype: Any, patches: Sequence[int], trim: bool
    ) -> PixelResult:
        value = holder.pop()
        if value.is_floating_point() and value.dtype != dtype:
            cast = self._cast_into_buffer(value, dtype)
        else:
            cast = value  # as _rebuild._cast leaves it
        del value  # the float32 original, freed here when it was cast
        rows = []
        offset = 0
        for n in patches:
            rows.append(tensor_fingerprint(cast[offset : offset + n]))
            offset += n
        nbytes = cast.numel() * cast.element_size()
        del cast
        if trim:
            release_freed_memory()
        return rows, nbytes

    def _cast_into_buffer(self, value: Any, dtype: Any) -> Any:
        import torch

        n = value.numel()
        if self._buffer is None or self._buffer.dtype != dtype or self._buffer.numel() < n:
            self._buffer = None  # the old one freed before the new one is allocated
            self._buffer = torch.empty(n, dtype=dtype)
        out = self._buffer[:n].view(value.shape)
        out.copy_(value)  # the kernel Tensor.to(dtype) runs: the same bits
        return out
