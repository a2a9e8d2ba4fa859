"""The tests' shared builders, one module per kind of thing built (import from ``helpers``):

* :mod:`.args`: trainer options parsed by the real parser (:func:`trainer_args`, :func:`dump_args`).
* :mod:`.media`: media files as a run stores them, PNGs, digests (:func:`put_media`,
  :func:`png_bytes`, :func:`noise_png`, :func:`digest_of`, :func:`tree_snapshot`).
* :mod:`.replay`: token-space samples and debug dumps with real processor counts
  (:func:`make_samples`, :func:`make_dump`).
* :mod:`.swap`: a deterministic symlink swap in the middle of a tree deletion.
* :mod:`.browser`: a real headless Chromium over the DevTools pipe (:func:`render`).
* :mod:`.waiting`: :func:`wait_until`, never a fixed sleep.

Fixtures (``ray_local``) and hypothesis profiles live in ``tests/conftest.py``.
"""

from helpers.args import dump_args, trainer_args
from helpers.media import digest_of, noise_png, png_bytes, put_media, tree_snapshot
from helpers.waiting import wait_until

__all__ = [
    "digest_of",
    "dump_args",
    "noise_png",
    "png_bytes",
    "put_media",
    "trainer_args",
    "tree_snapshot",
    "wait_until",
]
