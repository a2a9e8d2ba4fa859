"""Where a bundle lives: a local path, or an object-store URL; the one table of schemes.

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

What a URL is (:class:`StoreURL`: scheme, bucket, key) and which schemes are served
(:data:`SCHEMES`: the environment of each one's client, the class that serves it) are defined here,
below both halves: the local half refuses a URL where only a path makes sense without importing
the store client (:mod:`bundles._store.client`), which reads its rows from this table.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from bundles._errors import BundleError, UnsupportedLocationError
from bundles._format.repr import display

__all__ = [
    "SCHEMES",
    "SINGLE_WRITER_ENV",
    "STORE_EXTRA",
    "STORE_SCHEMES",
    "Scheme",
    "StoreURL",
    "check_location",
    "classify",
    "is_store_url",
    "local_path_only",
]

# The extra that installs the client of every scheme in SCHEMES.
STORE_EXTRA = "rollout-bundles[s3]"

_PART_RE = re.compile(r"[^/\x00]+")


@dataclass(frozen=True)
class Scheme:
    """What one URL scheme means: the environment its client reads and the class that serves it."""

    name: str
    #: The environment variables of its client (a change makes a new client: :func:`get_store`).
    env_prefixes: tuple[str, ...]
    #: Where its endpoint comes from when ``storage_options`` do not name one.
    endpoint_env: tuple[str, ...]
    #: What to set when no credentials are found.
    credentials: str
    #: The :class:`Store` subclass that serves it, called as ``store(scheme, bucket, options)``
    #: (a string names a class of bundles/_store/client.py, imported only when a URL is used).
    store: str | type[Any] = "ObstoreStore"

    @property
    def allow_http_env(self) -> str:
        return self.env_prefixes[0] + "ALLOW_HTTP"


#: Every scheme served, and what it means: the one table of schemes (:func:`classify` reads its
#: names, :func:`bundles._store.client.get_store` its rows; adding ``gs://`` or another backend is
#: one row and, where obstore does not serve it, one :class:`Store` subclass).
SCHEMES: dict[str, Scheme] = {
    "s3": Scheme(
        "s3",
        ("AWS_",),
        ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    ),
    "gs": Scheme(
        "gs",
        ("GOOGLE_",),
        ("GOOGLE_SERVICE_ENDPOINT",),
        "GOOGLE_SERVICE_ACCOUNT (a service account key file) or GOOGLE_APPLICATION_CREDENTIALS",
    ),
    "az": Scheme(
        "az",
        ("AZURE_", "AZURITE_"),
        ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", "AZURITE_BLOB_STORAGE_URL"),
        "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
    ),
}
STORE_SCHEMES = tuple(SCHEMES)


# Set to 1 where only one process ever writes a bucket whose store ignores preconditions
# (bundles/_store/probe.py): the refusal to commit there becomes a warning.
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
