"""Garbage on a store: unpublished generations and unreferenced media (``rollout-bundle gc``).

See :mod:`bundles._remote` for the protocol and docs/FORMAT.md §9 for the normative rule. gc
deletes only what it can prove a writer of ours wrote, and never an object that a committed
bundle lists, whatever prefix it is given:

* **The prefix.** A prefix inside a shared pool (a part named ``.media``), inside a generation
  (a part ``g<time>-<hex>``) or equal to a bundle's ``media/`` is refused
  (:class:`GarbagePrefixError`, naming the prefix to give instead): the pointers that list its
  objects lie outside it, so nothing in it can be judged. Every owner below (a bundle ``U``, a
  pool's parent ``A``) therefore lies under the prefix, and so does every pointer that may list
  its objects.
* **Proof of ownership.** Object names alone prove nothing (``site/media/<hex>.jpg`` may be
  anyone's). An object is a candidate only where a pointer or a generation of ours vouches for it:

  - ``U/<generation>/...``: ours by its name (48 random bits and a timestamp), provided every
    object under it is a name the writer writes (``manifest.json``, ``samples/NNNNNN.msgpack.zst``);
    garbage when ``U``'s readable pointer names another generation, or ``U`` has no pointer;
  - ``U/media/<64 hex><suffix>``: ours when ``U`` has a readable pointer, or when ``U`` has no
    pointer and no plain ``manifest.json`` but a generation of ours (a writer that died before
    publishing); garbage when the live manifest of ``U`` does not list it (a pointer with
    ``media: "../.media"`` lists none of it: what is left there is an earlier generation's);
  - ``A/.media/<64 hex><suffix>`` (a pool): ours when at least one bundle ``A/<name>`` has a
    readable pointer with ``media: "../.media"``, the only bundles that can use that pool;
    garbage when no live manifest of a bundle ``A/<name>`` lists it.

  Nothing else is ever touched: a plain copy's media (``aws s3 sync``: no pointer, not written by
  us), a ``media/`` or ``.media/`` with no pointer of ours beside it, names that are not
  ``<64 hex><suffix>``, objects one level deeper. A pool whose last bundle was removed is no longer
  provably a pool: it is left, and reported.
* **Fail safe.** A bundle whose pointer or manifest cannot be read or checked (a newer
  ``pointer_version``, a manifest whose digest disagrees with the pointer, an object removed
  meanwhile) is *unjudged*: nothing under it, and nothing in the pool beside it, is garbage.
* **Grace period.** Garbage younger than ``older_than_s`` is kept (a writer uploads media before
  it publishes the pointer that lists them).
* **Manifests not yet live.** Media that the manifest of another generation younger than the
  grace period lists are kept (a writer between its manifest and its pointer, which may have
  reused pooled objects instead of uploading them); an unreadable such manifest is treated as an
  unreadable pointer. A generation old enough to be removed protects nothing.
* **Just before deleting** pool media, the pointers beside the pool are listed again; if any
  appeared or changed since they were read, that pool is left for the next run (a writer that
  reused pooled objects published meanwhile).

A dry run computes exactly the same deletions and only reports them. Everything left for a
reason other than age is reported in :attr:`GarbageReport.skipped`, one :class:`Skipped` per place.

Considered and not done: a marker on each pooled object (object metadata on put) would prove
ownership object by object, but object listings do not return metadata, so gc would need one
request per candidate, media put by older writers carry none, and a create-only put of an object
another writer uploaded keeps theirs unmarked; a pointer beside the pool proves the same for the
whole pool in requests gc makes anyway.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bundles._errors import BundleError, GarbagePrefixError
from bundles._faults import fault_point
from bundles._layout import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    SHARD_PATH_RE,
    STORE_GENERATION_RE,
    STORE_MEDIA_POOL,
    STORE_POINTER_NAME,
)
from bundles._manifest import parse_manifest_bytes
from bundles._remote._pointer import MAX_POINTER_BYTES, _Place, parse_pointer
from bundles._source import layout_name_ok
from bundles._store import Store, StoreURL, get_store, parallel, store_error

#: Why gc left objects that are not garbage of ours (the ``reason`` of :class:`Skipped`).
NOT_OURS_POOL = "no bundle beside it has a pointer naming '../.media': not a pool gc can prove it wrote"
NOT_OURS_MEDIA = "no pointer or generation of ours beside it: not written by rollout-bundles"
PLAIN_COPY = "a manifest.json but no bundle.json beside it (a bundle copied verbatim, or no bundle): not gc's"
OUTSIDE = "its bundle lies above the prefix: give the bundle's prefix"
UNJUDGED = "a pointer or manifest beside it cannot be read or checked: everything it may use is kept"
FOREIGN_GENERATION = "a generation-named prefix holding objects no writer of ours writes"
CHANGED = "a pointer beside the pool appeared or changed while gc ran: left for the next run"


# -- garbage -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Skipped:
    """Objects gc left for ``reason`` (not their age) at ``where`` (a URL)."""

    reason: str
    where: str
    objects: int


@dataclass
class GarbageReport:
    """What :func:`collect_garbage` found (and removed, unless ``dry_run``)."""

    bundles: int = 0
    generations: list[str] = field(default_factory=list)  # unpublished or replaced generations
    media: list[str] = field(default_factory=list)  # unreferenced media (keys)
    bytes: int = 0
    kept_young: int = 0  # garbage younger than the grace period, left alone
    dry_run: bool = False
    skipped: list[Skipped] = field(default_factory=list)  # left for a reason, by place


def _join(base: str, rel: str) -> str:
    return f"{base}/{rel}" if base else rel


def _parent(key: str) -> str:
    return key.rpartition("/")[0]


def _under(key: str, prefix: str) -> bool:
    """``key`` is ``prefix`` or lies below it (by whole parts)."""
    return not prefix or key == prefix or key.startswith(prefix + "/")


def _check_prefix(url: StoreURL, store: Store) -> None:
    """Refuse a prefix inside a pool, a generation or a bundle's media (see the module docstring)."""
    parts = url.key.split("/") if url.key else []
    for i, part in enumerate(parts):
        owner = StoreURL(f"{url.scheme}://{url.bucket}/{'/'.join(parts[:i])}")
        if part == STORE_MEDIA_POOL:
            what = (
                f"the shared media pool of the bundles under {owner}"
                if i == len(parts) - 1
                else f"inside the shared media pool {owner.child(STORE_MEDIA_POOL)}"
            )
            raise GarbagePrefixError(
                f"{url}: {what}: gc collects a pool only against every bundle that may use it; "
                f"give the pool's parent, {owner}"
            )
        if STORE_GENERATION_RE.fullmatch(part):
            raise GarbagePrefixError(
                f"{url}: inside the generation {part} of {owner}: its pointer lies outside the prefix; "
                f"give the bundle, {owner}"
            )
    if parts and parts[-1] == MEDIA_DIR:
        owner = url.parent
        try:
            pointer = store.head(owner.key_of(STORE_POINTER_NAME))
        except Exception as e:
            raise store_error(url, "look for the bundle beside the prefix", e) from e
        if pointer is not None:
            raise GarbagePrefixError(
                f"{url}: the media of the bundle {owner}: its pointer lies outside the prefix; "
                f"give the bundle, {owner}"
            )


@dataclass
class _Bundle:
    """What gc knows of one bundle key ``U``."""

    key: str
    pointer_key: bool = False  # U/bundle.json exists
    plain: bool = False  # U/manifest.json exists (a plain layout)
    readable: bool = False  # the pointer and its manifest were read and checked
    shared: bool = False
    generation: str | None = None  # the live one
    etag: str | None = None
    listed: set[str] = field(default_factory=set)  # media file names the live manifest lists
    generations: set[str] = field(default_factory=set)  # generations of ours under U
    pending: set[str] = field(default_factory=set)  # media names the other generations' manifests list
    pending_bad: bool = False  # another generation's manifest could not be read


def _judge(store: Store, url: StoreURL, b: _Bundle) -> None:
    """Read ``U``'s pointer and its manifest; leave ``b`` unreadable when either fails a check."""
    bundle_url = StoreURL(f"{url.scheme}://{url.bucket}/{b.key}")
    try:
        data, meta = store.get(_join(b.key, STORE_POINTER_NAME), MAX_POINTER_BYTES, "pointer cap")
        pointer = parse_pointer(data, f"{bundle_url}/{STORE_POINTER_NAME}", meta.get("e_tag"))
        place = _Place(bundle_url, store, pointer)
        raw, _ = store.get(place.key(MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        if (
            len(raw) != pointer.manifest_size
            or "sha256:" + hashlib.sha256(raw).hexdigest() != pointer.manifest_digest
        ):
            return  # not the manifest the pointer names: unjudged
        manifest = parse_manifest_bytes(raw, f"{bundle_url}/{MANIFEST_NAME}")
    except (FileNotFoundError, BundleError):
        # Removed meanwhile, or a pointer or manifest this version cannot read: not ours to judge.
        return
    except Exception as e:
        raise store_error(bundle_url, "read the bundle", e) from e
    b.readable, b.shared, b.generation, b.etag = True, pointer.shared_media, pointer.generation, pointer.etag
    b.listed = {m.filename for m in manifest.media}


def _read_pending(store: Store, url: StoreURL, b: _Bundle, gen: str) -> None:
    """Add the media that ``U/<gen>/manifest.json`` (not the live generation) lists to
    ``b.pending``: a writer about to publish it, or one whose pointer swap gc has not seen."""
    where = f"{url.scheme}://{url.bucket}/{_join(_join(b.key, gen), MANIFEST_NAME)}"
    try:
        raw, _ = store.get(_join(_join(b.key, gen), MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        b.pending.update(m.filename for m in parse_manifest_bytes(raw, where).media)
    except FileNotFoundError:
        return  # removed meanwhile (retired by its writer, or by another gc)
    except BundleError:
        b.pending_bad = True
    except Exception as e:
        raise store_error(where, "read the manifest", e) from e


def _plain_ok(store: Store, b: _Bundle) -> bool:
    """``U/manifest.json`` is a bundle's manifest: count it, and note what it lists (its media are
    never gc's; only the unlisted ones are reported as left)."""
    try:
        raw, _ = store.get(_join(b.key, MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        manifest = parse_manifest_bytes(raw, b.key)
    except (FileNotFoundError, BundleError):
        return False
    b.listed = {m.filename for m in manifest.media}
    return True


def _pointer_tags(store: Store, parent: str, children: list[str]) -> dict[str, str | None]:
    """The ETag of each ``parent/<child>/bundle.json`` now (absent ones left out)."""
    keys = [_join(_join(parent, c), STORE_POINTER_NAME) for c in children]
    metas = parallel(store.head, keys)
    return {k: (m or {}).get("e_tag") for k, m in zip(keys, metas, strict=True) if m is not None}


def collect_garbage(
    prefix_text: str,
    *,
    older_than_s: float = 24 * 3600.0,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> GarbageReport:
    """Remove, under ``prefix``, the generations no pointer names and the media no live manifest
    lists, when older than ``older_than_s`` and provably written by rollout-bundles (the rule of
    the module docstring). With ``dry_run``, report exactly what a run would remove.

    Raises:
        GarbagePrefixError: ``prefix`` lies inside a pool, a generation or a bundle's media; the
            message names the prefix to give instead. Nothing is deleted.
        BucketNotFoundError: the bucket does not exist.
        BundleIOError: the store refused a request after the retries.
    """
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    report = GarbageReport(dry_run=dry_run)
    _check_prefix(url, store)
    try:
        objects = store.listing(url.key)
    except Exception as e:
        raise store_error(url, "list", e) from e
    now = datetime.datetime.now(datetime.timezone.utc)
    by_key = {m["path"]: m for m in objects}

    def where(key: str) -> str:
        return f"{url.scheme}://{url.bucket}/{key}" if key else f"{url.scheme}://{url.bucket}"

    # Every bundle key U that something of ours (or a plain copy) marks.
    found: dict[str, _Bundle] = {}
    gen_objects: dict[tuple[str, str], list[str]] = {}  # (U, generation) -> its keys
    for key in by_key:
        parts = key.split("/")
        gen_at = next((i for i, p in enumerate(parts[:-1]) if STORE_GENERATION_RE.fullmatch(p)), None)
        if gen_at is not None:
            u = "/".join(parts[:gen_at])
            found.setdefault(u, _Bundle(u))
            gen_objects.setdefault((u, parts[gen_at]), []).append(key)
        elif parts[-1] == STORE_POINTER_NAME:
            u = _parent(key)
            found.setdefault(u, _Bundle(u)).pointer_key = True
        elif parts[-1] == MANIFEST_NAME:
            u = _parent(key)
            found.setdefault(u, _Bundle(u)).plain = True
    foreign: set[tuple[str, str]] = set()
    for (u, gen), keys in gen_objects.items():
        rels = [k[len(_join(u, gen)) + 1 :] for k in keys]
        if all(r == MANIFEST_NAME or SHARD_PATH_RE.fullmatch(r) for r in rels):
            found[u].generations.add(gen)
        else:
            foreign.add((u, gen))  # a name like ours holding what no writer of ours writes
    with_pointer = [b for b in found.values() if b.pointer_key and _under(b.key, url.key)]
    try:
        parallel(lambda b: _judge(store, url, b), with_pointer)
    except BundleError:
        raise
    except Exception as e:
        raise store_error(url, "read the bundles", e) from e

    # The manifests of the other generations this run keeps (younger than the grace period):
    # what they list is kept too, so a writer between its manifest and its pointer (which may
    # have reused pooled media) never loses it. A generation this run removes lists nothing.
    def young(keys: list[str]) -> bool:
        return any((now - by_key[k]["last_modified"]).total_seconds() <= older_than_s for k in keys)

    others = [
        (b, gen)
        for b in found.values()
        for gen in sorted(b.generations)
        if not (b.readable and gen == b.generation)
        and _join(_join(b.key, gen), MANIFEST_NAME) in by_key
        and young(gen_objects[(b.key, gen)])
    ]
    try:
        parallel(lambda item: _read_pending(store, url, *item), others)
    except BundleError:
        raise
    except Exception as e:
        raise store_error(url, "read the generations' manifests", e) from e
    plain = [b for b in found.values() if b.plain and not b.pointer_key and _under(b.key, url.key)]
    try:
        sound = parallel(lambda b: _plain_ok(store, b), plain)
    except Exception as e:
        raise store_error(url, "read the bundles copied verbatim", e) from e
    report.bundles = sum(b.readable for b in found.values()) + sum(sound)

    doomed: list[str] = []
    skipped: dict[tuple[str, str], int] = {}

    def sweep(keys: list[str]) -> bool:
        """Doom ``keys`` (one unit) if all are past the grace period; False if kept young."""
        if young(keys):
            report.kept_young += len(keys)
            return False
        doomed.extend(keys)
        report.bytes += sum(int(by_key[k]["size"]) for k in keys)
        return True

    # Generations.
    for (u, gen), keys in sorted(gen_objects.items()):
        b = found[u]
        if not _under(u, url.key):
            continue
        if b.pointer_key and not b.readable:
            skipped[(UNJUDGED, where(u))] = skipped.get((UNJUDGED, where(u)), 0) + len(keys)
            continue
        if b.readable and b.generation == gen:
            continue  # the live generation
        if (u, gen) in foreign:
            skipped[(FOREIGN_GENERATION, where(_join(u, gen)))] = len(keys)
            continue
        if sweep(keys):
            report.generations.append(_join(u, gen))

    # Media: group the candidates by their directory.
    dirs: dict[str, list[str]] = {}
    for key in by_key:
        d, _, name = key.rpartition("/")
        if d.rpartition("/")[2] in (MEDIA_DIR, STORE_MEDIA_POOL) and layout_name_ok(f"{MEDIA_DIR}/{name}"):
            dirs.setdefault(d, []).append(key)
    by_parent: dict[str, list[_Bundle]] = {}
    for b in found.values():
        by_parent.setdefault(_parent(b.key), []).append(b)
    pools: dict[str, list[str]] = {}  # pool dir -> its doomed keys (checked again before deleting)
    for d, keys in sorted(dirs.items()):
        owner, _, kind = d.rpartition("/")
        if not _under(owner, url.key):
            skipped[(OUTSIDE, where(d))] = len(keys)
            continue
        if kind == STORE_MEDIA_POOL:
            beside = [b for b in by_parent.get(owner, []) if b.key != owner]
            if any((b.pointer_key and not b.readable) or b.pending_bad for b in beside):
                skipped[(UNJUDGED, where(d))] = len(keys)
                continue
            users = [b for b in beside if b.readable and b.shared]
            if not users:
                skipped[(NOT_OURS_POOL, where(d))] = len(keys)
                continue
            listed = set().union(*(b.listed for b in users), *(b.pending for b in beside))
        else:
            b = found.get(owner, _Bundle(owner))
            if (b.pointer_key and not b.readable) or b.pending_bad:
                skipped[(UNJUDGED, where(d))] = len(keys)
                continue
            if b.readable:
                listed = (b.listed if not b.shared else set()) | b.pending
            elif b.plain:
                unlisted = sum(k.rpartition("/")[2] not in b.listed for k in keys)
                if unlisted:
                    skipped[(PLAIN_COPY, where(d))] = unlisted
                continue
            elif b.generations:
                listed = b.pending  # a writer that died before publishing (or is about to)
            else:
                skipped[(NOT_OURS_MEDIA, where(d))] = len(keys)
                continue
        garbage = [k for k in sorted(keys) if k.rpartition("/")[2] not in listed]
        mine = [k for k in garbage if sweep([k])]
        if kind == STORE_MEDIA_POOL and mine:
            pools[d] = mine
        else:
            report.media.extend(mine)

    # Pools: the pointers beside them again, just before deleting (see the module docstring).
    for d, keys in pools.items():
        owner = d.rpartition("/")[0]
        fault_point("gc.before-recheck", where(d))
        before = {
            _join(b.key, STORE_POINTER_NAME): b.etag
            for b in by_parent.get(owner, [])
            if b.key != owner and b.pointer_key
        }
        try:
            names = [n for n in store.children(owner) if n != STORE_MEDIA_POOL]
            now_tags = _pointer_tags(store, owner, names)
        except Exception as e:
            raise store_error(where(owner), "read the pointers beside the pool again", e) from e
        if now_tags != before:
            skipped[(CHANGED, where(d))] = len(keys)
            left = set(keys)
            doomed[:] = [k for k in doomed if k not in left]
            report.bytes -= sum(int(by_key[k]["size"]) for k in keys)
            continue
        report.media.extend(keys)

    report.skipped = [Skipped(r, w, n) for (r, w), n in sorted(skipped.items())]
    if not dry_run and doomed:
        doomed.sort(key=lambda k: not k.endswith("/" + MANIFEST_NAME))  # a generation's manifest first
        try:
            store.delete(doomed)
        except Exception as e:
            raise store_error(url, "delete garbage", e) from e
    return report
