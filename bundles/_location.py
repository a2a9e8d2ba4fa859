"""Where a bundle lives: a local path, or an object-store URL.

Every public entry point that takes a bundle location (``write_bundle``, ``open_bundle``,
``pack_bundle``, ``unpack_bundle``, ``remove_bundle``, the CLI, trainer_hooks' ``--save`` and
``--load``) asks :func:`classify` first. A string of the form ``<scheme>://...`` is a URL and is
never taken for a local path: before this check, ``write_bundle("s3://bucket/x", ...)`` created
the local directory ``./s3:/bucket/x`` and reported success. A URL is accepted only when its
scheme is one of :data:`STORE_SCHEMES` *and* the optional dependency that serves it (obstore,
the ``rollout-bundles[s3]`` extra) imports; anything else is refused in one line naming the
scheme and what to install.

``pathlib`` collapses ``s3://b/x`` to ``s3:/b/x``; that form, for a store scheme in any case
(``S3:/b/x``), is refused too (it is a URL that went through ``Path()``, not a directory anyone
means to create). A NUL byte in a path is refused with a :class:`~bundles.BundleError` naming
the path (the ``os`` functions would raise a bare ``ValueError``).
"""

from __future__ import annotations

import os
import re

from bundles._errors import UnsupportedLocationError
from bundles._format.repr import display
from bundles._store import STORE_EXTRA, STORE_SCHEMES

__all__ = [
    "SINGLE_WRITER_ENV",
    "STORE_EXTRA",
    "STORE_SCHEMES",
    "check_location",
    "classify",
    "is_store_url",
    "local_path_only",
]

# STORE_SCHEMES and STORE_EXTRA: the schemes served and the extra that installs their client,
# read from the one table of schemes (bundles._store.SCHEMES).
# Set to 1 where only one process ever writes a bucket whose store ignores preconditions
# (bundles/_remote/_probe.py): the refusal to commit there becomes a warning.
SINGLE_WRITER_ENV = "ROLLOUT_BUNDLE_SINGLE_WRITER"
_URL_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# Case-insensitive, as schemes are (RFC 3986): ``Path("S3://b/x")`` is ``S3:/b/x``, still a URL.
_COLLAPSED_RE = re.compile(rf"({'|'.join(STORE_SCHEMES)}):/(?!/)", re.IGNORECASE)


def _refuse_nul(text: str, what: str) -> None:
    """A NUL byte ends a path for the kernel (``os`` raises ``ValueError``): refuse it by name."""
    if "\x00" in text:
        raise UnsupportedLocationError(f"{display(text)}: {what}: a path must not hold a NUL byte")


def _text(location: object) -> str | None:
    if isinstance(location, str):
        return location
    if isinstance(location, os.PathLike):
        value = os.fspath(location)
        return value if isinstance(value, str) else None
    return None


def url_scheme(location: object) -> str | None:
    """The scheme of a ``<scheme>://`` URL (lowercase), or None for anything else."""
    text = _text(location)
    if text is None:
        return None
    m = _URL_RE.match(text)
    return m.group(1).lower() if m else None


def is_store_url(location: object) -> bool:
    """True when ``location`` is an object-store URL this package can serve (``s3://``,
    ``gs://``, ``az://``), whether or not its extra is installed (:func:`classify` tells)."""
    return url_scheme(location) in STORE_SCHEMES


def _store_available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def classify(location: object, what: str = "bundle") -> str | None:
    """``"store"`` for a usable object-store URL, None for a local path; raise
    :class:`UnsupportedLocationError` for any other URL, or a store URL whose extra is missing."""
    text = _text(location)
    if text is None:
        return None
    _refuse_nul(text, what)
    scheme = url_scheme(text)
    if scheme is None:
        m = _COLLAPSED_RE.match(text)
        if m:
            shown = m.group(1).lower()
            raise UnsupportedLocationError(
                f"{text}: {what}: looks like a {shown}:// URL whose '//' was collapsed (by pathlib?); "
                f"pass the URL as a string, {shown}://{text[len(m.group(0)) :]}"
            )
        return None
    if scheme not in STORE_SCHEMES:
        # The extra's hint only where it is missing: installed, it would change nothing.
        hint = "" if _store_available() else f" (pip install '{STORE_EXTRA}')"
        raise UnsupportedLocationError(
            f"{text}: {what}: unsupported URL scheme {scheme!r}; a bundle is a local path or an "
            f"{', '.join(s + '://' for s in STORE_SCHEMES)} URL{hint}"
        )
    if not _store_available():
        raise UnsupportedLocationError(
            f"{text}: {what}: the {scheme}:// scheme needs the optional dependency obstore, which is not "
            f"installed: pip install '{STORE_EXTRA}'"
        )
    return "store"


def check_location(location: str | os.PathLike[str], what: str = "bundle") -> bool:
    """True for an object-store URL that can be served, False for a local path; raise
    :class:`UnsupportedLocationError` (one line: the scheme and the extra to install) for any
    other URL. ``what`` names the argument or option in the message (``"--save"``)."""
    return classify(location, what) == "store"


def local_path_only(location: object, what: str) -> None:
    """Refuse any URL where only a local path makes sense (a media directory, a scratch dir)."""
    text = _text(location)
    if text is None:
        return
    _refuse_nul(text, what)
    scheme = url_scheme(text)
    if scheme is not None or _COLLAPSED_RE.match(text):
        raise UnsupportedLocationError(
            f"{text}: {what}: expected a local path, found a URL ({scheme or text.split(':', 1)[0]}://); "
            "this argument cannot be on an object store"
        )
