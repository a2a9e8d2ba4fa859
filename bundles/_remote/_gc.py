"""Garbage on a store: unpublished generations and unreferenced pooled media (``rollout-bundle gc``).

See :mod:`bundles._remote` for the protocol."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bundles._errors import (
    BundleError,
)
from bundles._layout import (
    MANIFEST_NAME,
    MEDIA_DIR,
    STORE_MEDIA_POOL,
    STORE_POINTER_NAME,
)
from bundles._remote._pointer import _GEN_KEY_RE, _Place, parse_pointer
from bundles._source import layout_name_ok
from bundles._store import StoreURL, get_store, store_error


# -- garbage -------------------------------------------------------------------------------------
@dataclass
class GarbageReport:
    """What :func:`collect_garbage` found (and removed, unless ``dry_run``)."""

    bundles: int = 0
    generations: list[str] = field(default_factory=list)  # unpublished or replaced generations
    media: list[str] = field(default_factory=list)  # unreferenced media of shared pools
    bytes: int = 0
    kept_young: int = 0  # garbage younger than the grace period, left alone
    dry_run: bool = False


def collect_garbage(
    prefix_text: str,
    *,
    older_than_s: float = 24 * 3600.0,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> GarbageReport:
    """Remove, under ``prefix``, every generation that no pointer names and every media file of a
    pool that no live manifest lists, when older than ``older_than_s`` (see the module
    docstring). With ``dry_run``, only report them."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    report = GarbageReport(dry_run=dry_run)
    try:
        objects = store.listing(url.key)
    except Exception as e:
        raise store_error(url, "list", e) from e
    now = datetime.datetime.now(datetime.timezone.utc)
    by_key = {m["path"]: m for m in objects}
    live_gens: set[str] = set()  # "<bundle key>/<generation>"
    referenced: set[str] = set()  # media keys some live manifest lists
    pools: set[str] = set()
    unjudged: set[str] = set()
    for key in sorted(by_key):
        if not key.endswith("/" + STORE_POINTER_NAME) and key != STORE_POINTER_NAME:
            continue
        bundle_key = key[: -len(STORE_POINTER_NAME)].rstrip("/")
        bundle_url = StoreURL(f"{url.scheme}://{url.bucket}/{bundle_key}")
        try:
            data, meta = store.get(key)
            pointer = parse_pointer(data, f"{bundle_url}/{STORE_POINTER_NAME}", meta.get("e_tag"))
            place = _Place(bundle_url, store, pointer)
            manifest = json.loads((store.get(place.key(MANIFEST_NAME)))[0])
        except (FileNotFoundError, BundleError):
            # Removed meanwhile, or a pointer this version cannot read (a newer pointer_version):
            # not ours to judge, so nothing under that bundle is garbage.
            unjudged.add(bundle_key)
            continue
        except Exception as e:
            raise store_error(bundle_url, "read the bundle", e) from e
        report.bundles += 1
        live_gens.add(bundle_key.rstrip("/") + "/" + str(pointer.generation))
        pools.add(place.media_prefix)
        for entry in manifest.get("media", []):
            referenced.add(f"{place.media_prefix}/{entry['digest'][7:]}{entry['suffix']}")
    # Plain layouts (a directory bundle synced verbatim: U/manifest.json, no pointer) are live too.
    for key in sorted(by_key):
        if not key.endswith("/" + MANIFEST_NAME) or _GEN_KEY_RE.fullmatch(key):
            continue
        bundle_key = key[: -len(MANIFEST_NAME) - 1]
        if f"{bundle_key}/{STORE_POINTER_NAME}" in by_key:
            continue
        try:
            manifest = json.loads((store.get(key))[0])
            names = [f"{e['digest'][7:]}{e['suffix']}" for e in manifest.get("media", [])]
        except Exception:
            continue
        report.bundles += 1
        pools.add(f"{bundle_key}/{MEDIA_DIR}")
        referenced.update(f"{bundle_key}/{MEDIA_DIR}/{n}" for n in names)
    # The media/ of every bundle prefix (one with a pointer, or with generations: a writer that
    # died before publishing) hold only that bundle's media: unlisted ones are garbage.
    for key in by_key:
        g = _GEN_KEY_RE.fullmatch(key)
        if g:
            pools.add(f"{g['gen'].rpartition('/')[0]}/{MEDIA_DIR}".lstrip("/"))
    doomed: list[str] = []
    for key, m in by_key.items():
        if any(key.startswith(u + "/") for u in unjudged):
            continue
        age = (now - m["last_modified"]).total_seconds()
        g = _GEN_KEY_RE.fullmatch(key)
        parent, _, name = key.rpartition("/")
        if g:
            garbage = g["gen"] not in live_gens
            if garbage and age > older_than_s and g["gen"] not in report.generations:
                report.generations.append(g["gen"])
        else:
            in_pool = parent in pools or parent == STORE_MEDIA_POOL or parent.endswith("/" + STORE_MEDIA_POOL)
            garbage = in_pool and key not in referenced and layout_name_ok(f"{MEDIA_DIR}/{name}")
            if garbage and age > older_than_s:
                report.media.append(key)
        if garbage:
            if age > older_than_s:
                doomed.append(key)
                report.bytes += int(m["size"])
            else:
                report.kept_young += 1
    if not dry_run and doomed:
        doomed.sort(key=lambda k: not k.endswith("/" + MANIFEST_NAME))
        try:
            (store.delete(doomed))
        except Exception as e:
            raise store_error(url, "delete garbage", e) from e
    return report
