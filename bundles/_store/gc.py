"""Garbage on a store: unpublished generations and unreferenced media (``rollout-bundle gc``).

See :mod:`bundles._store` for the protocol and docs/FORMAT.md §9 for the normative rule. gc
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

import contextlib
import datetime
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bundles._errors import (
    BundleError,
    GarbagePrefixError,
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreFailure,
)
from bundles._format.layout import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    SHARD_PATH_RE,
    STORE_GENERATION_RE,
    STORE_MEDIA_POOL,
    STORE_POINTER_NAME,
)
from bundles._format.manifest import parse_manifest_bytes
from bundles._local.faults import fault_point
from bundles._local.proof import Proof
from bundles._local.sources import layout_name_ok
from bundles._store.client import Store, get_store, naming, parallel
from bundles._store.pointer import examine_prefix
from bundles._store.probe import PROBE_PREFIX
from bundles._urls import StoreURL

#: Why gc left objects that are not garbage of ours (the ``reason`` of :class:`Skipped`).
NOT_OURS_POOL = "no bundle beside it has a pointer naming '../.media': not a pool gc can prove it wrote"
NOT_OURS_MEDIA = "no pointer or generation of ours beside it: not written by rollout-bundles"
PLAIN_COPY = "a manifest.json but no bundle.json beside it (a bundle copied verbatim, or no bundle): not gc's"
OUTSIDE = "its bundle lies above the prefix: give the bundle's prefix"
UNJUDGED = "a pointer or manifest beside it cannot be read or checked: everything it may use is kept"
FOREIGN_GENERATION = "a generation-named prefix holding objects no writer of ours writes"
CHANGED = "a pointer beside the pool appeared or changed while gc ran: left for the next run"
CHANGED_POINTER = "the bundle's pointer appeared or changed while gc ran: left for the next run"


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
    # Whose clock the ages were measured on: "store" (a reference object's last_modified), or
    # "local" in a dry run the store would not let write one.
    clock: str = "store"


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
        pointer = store.head(owner.key_of(STORE_POINTER_NAME))
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
    """Prove ``U`` a bundle by its pointer (:func:`examine_prefix`, the one proof: the pointer
    parses, names a generation of ``U`` whose manifest has the recorded size and digest and
    validates); leave ``b`` unreadable when it is not proven."""
    bundle_url = StoreURL(f"{url.scheme}://{url.bucket}/{b.key}")
    try:
        found = examine_prefix(store, bundle_url)
    except StoreFailure:
        raise
    except BundleError:
        return  # removed meanwhile, or a pointer this version cannot read: not ours to judge
    if not isinstance(found, Proof) or found.generation is None:
        return  # not proven (or its pointer went meanwhile): unjudged
    b.readable, b.shared, b.generation, b.etag = True, found.shared_media, found.generation, found.etag
    b.listed = {m.filename for m in found.manifest.media}


def _read_pending(store: Store, url: StoreURL, b: _Bundle, gen: str) -> None:
    """Add the media that ``U/<gen>/manifest.json`` (not the live generation) lists to
    ``b.pending``: a writer about to publish it, or one whose pointer swap gc has not seen."""
    where = f"{url.scheme}://{url.bucket}/{_join(_join(b.key, gen), MANIFEST_NAME)}"
    try:
        raw, _ = store.get(_join(_join(b.key, gen), MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        b.pending.update(m.filename for m in parse_manifest_bytes(raw, where).media)
    except ObjectNotFoundError:
        return  # removed meanwhile (retired by its writer, or by another gc)
    except StoreFailure:
        raise
    except BundleError:
        b.pending_bad = True


def _plain_ok(store: Store, b: _Bundle) -> bool:
    """``U/manifest.json`` is a bundle's manifest: count it, and note what it lists (its media are
    never gc's; only the unlisted ones are reported as left)."""
    try:
        raw, _ = store.get(_join(b.key, MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        manifest = parse_manifest_bytes(raw, b.key)
    except StoreFailure:
        raise
    except BundleError:
        return False
    b.listed = {m.filename for m in manifest.media}
    return True


def _pointer_tags(store: Store, parent: str, children: list[str]) -> dict[str, str | None]:
    """The ETag of each ``parent/<child>/bundle.json`` now (absent ones left out)."""
    keys = [_join(_join(parent, c), STORE_POINTER_NAME) for c in children]
    metas = parallel(store.head, keys)
    return {k: (m or {}).get("e_tag") for k, m in zip(keys, metas, strict=True) if m is not None}


def store_now(store: Store, url: StoreURL) -> datetime.datetime | None:
    """The store's own clock now: the ``last_modified`` of a fresh reference object put beside
    ``url`` (not inside it: never among the objects of a bundle under it), named as the
    precondition probe names its key, and deleted at once. None when the store refuses the put
    (read-only credentials)."""
    name = PROBE_PREFIX + secrets.token_hex(8)
    key = _join(_parent(url.key), name)
    try:
        with naming(url, "put gc's clock reference"):
            store.put(key, b"gc clock reference")
    except StoreAccessDeniedError:
        return None
    try:
        with naming(url, "read gc's clock reference"):
            meta = store.head(key)
    finally:
        with contextlib.suppress(Exception):
            store.delete([key])
    if meta is None:
        raise BundleError(f"{url}: gc's clock reference {name} vanished before it was read")
    return meta["last_modified"]


@dataclass
class _Scan:
    """One listing of the prefix and what gc made of it. Every age is measured on the store's
    clock (``now`` comes from :func:`store_now`), never on this machine's: a collector whose
    clock is ahead would otherwise take a writer's fresh objects for old garbage."""

    url: StoreURL
    store: Store
    now: datetime.datetime
    older_than_s: float
    by_key: dict[str, dict[str, Any]]
    found: dict[str, _Bundle] = field(default_factory=dict)  # every bundle key U marked by ours
    gen_objects: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (U, gen) -> keys
    foreign: set[tuple[str, str]] = field(default_factory=set)  # generation names holding others'

    def where(self, key: str) -> str:
        base = f"{self.url.scheme}://{self.url.bucket}"
        return f"{base}/{key}" if key else base

    def young(self, keys: list[str]) -> bool:
        """Any of ``keys`` younger than the grace period, on the store's clock and to its
        timestamps' resolution (whole seconds on S3): ``older_than_s=0`` makes everything old."""
        return any(
            (self.now - self.by_key[k]["last_modified"]).total_seconds() < self.older_than_s for k in keys
        )

    def bundle(self, key: str) -> _Bundle:
        return self.found.setdefault(key, _Bundle(key))


@dataclass
class _Plan:
    """What this run deletes and what it leaves for a reason."""

    report: GarbageReport
    doomed: list[str] = field(default_factory=list)
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    pools: dict[str, list[str]] = field(default_factory=dict)  # pool dir -> its doomed keys
    owners: dict[str, list[str]] = field(default_factory=dict)  # bundle key U -> its doomed keys

    def skip(self, reason: str, where: str, n: int) -> None:
        self.skipped[(reason, where)] = self.skipped.get((reason, where), 0) + n

    def unplan(self, scan: _Scan, keys: list[str], reason: str, where: str) -> None:
        """Leave ``keys``, planned for deletion, for ``reason``."""
        left = set(keys)
        self.doomed[:] = [k for k in self.doomed if k not in left]
        self.report.bytes -= sum(int(scan.by_key[k]["size"]) for k in keys)
        gens = self.report.generations
        gens[:] = [g for g in gens if not any(k.startswith(g + "/") for k in left)]
        self.report.media[:] = [m for m in self.report.media if m not in left]
        self.skip(reason, where, len(keys))


def _scan(store: Store, url: StoreURL, now: datetime.datetime, older_than_s: float) -> _Scan:
    """List the prefix and mark every bundle key ``U`` that something of ours (or a plain copy)
    marks: a generation, a pointer, a plain manifest."""
    objects = store.listing(url.key)
    scan = _Scan(url, store, now, older_than_s, {m["path"]: m for m in objects})
    for key in scan.by_key:
        parts = key.split("/")
        gen_at = next((i for i, p in enumerate(parts[:-1]) if STORE_GENERATION_RE.fullmatch(p)), None)
        if gen_at is not None:
            u = "/".join(parts[:gen_at])
            scan.bundle(u)
            scan.gen_objects.setdefault((u, parts[gen_at]), []).append(key)
        elif parts[-1] == STORE_POINTER_NAME:
            scan.bundle(_parent(key)).pointer_key = True
        elif parts[-1] == MANIFEST_NAME:
            scan.bundle(_parent(key)).plain = True
    for (u, gen), keys in scan.gen_objects.items():
        rels = [k[len(_join(u, gen)) + 1 :] for k in keys]
        if all(r == MANIFEST_NAME or SHARD_PATH_RE.fullmatch(r) for r in rels):
            scan.found[u].generations.add(gen)
        else:
            scan.foreign.add((u, gen))  # a name like ours holding what no writer of ours writes
    return scan


def _read_bundles(scan: _Scan) -> int:
    """Read every pointer and manifest gc judges by; return how many live bundles it found.

    The manifests of the other generations this run keeps (younger than the grace period) are
    read too: what they list is kept, so a writer between its manifest and its pointer (which may
    have reused pooled media) never loses it. A generation this run removes lists nothing."""
    store, url, found = scan.store, scan.url, scan.found
    with_pointer = [b for b in found.values() if b.pointer_key and _under(b.key, url.key)]
    parallel(lambda b: _judge(store, url, b), with_pointer)
    others = [
        (b, gen)
        for b in found.values()
        for gen in sorted(b.generations)
        if not (b.readable and gen == b.generation)
        and _join(_join(b.key, gen), MANIFEST_NAME) in scan.by_key
        and scan.young(scan.gen_objects[(b.key, gen)])
    ]
    parallel(lambda item: _read_pending(store, url, *item), others)
    plain = [b for b in found.values() if b.plain and not b.pointer_key and _under(b.key, url.key)]
    sound = parallel(lambda b: _plain_ok(store, b), plain)
    return sum(b.readable for b in found.values()) + sum(sound)


def _sweep(scan: _Scan, plan: _Plan, owner: str | None, keys: list[str]) -> bool:
    """Doom ``keys`` (one unit; ``owner`` the bundle key whose pointer is read again before they
    go, None for a pool's media) if all are past the grace period; False if kept young."""
    if scan.young(keys):
        plan.report.kept_young += len(keys)
        return False
    plan.doomed.extend(keys)
    if owner is not None:
        plan.owners.setdefault(owner, []).extend(keys)
    plan.report.bytes += sum(int(scan.by_key[k]["size"]) for k in keys)
    return True


def _plan_generations(scan: _Scan, plan: _Plan) -> None:
    """Doom the generations of ours that no readable pointer names (never the live one)."""
    for (u, gen), keys in sorted(scan.gen_objects.items()):
        b = scan.found[u]
        if not _under(u, scan.url.key):
            continue
        if b.pointer_key and not b.readable:
            plan.skip(UNJUDGED, scan.where(u), len(keys))
            continue
        if b.readable and b.generation == gen:
            continue  # the live generation
        if (u, gen) in scan.foreign:
            plan.skip(FOREIGN_GENERATION, scan.where(_join(u, gen)), len(keys))
            continue
        if _sweep(scan, plan, u, keys):
            plan.report.generations.append(_join(u, gen))


def _listed_for(scan: _Scan, plan: _Plan, d: str, keys: list[str]) -> set[str] | None:
    """The media names that protect the objects ``keys`` of the media directory ``d`` (a pool
    or a bundle's ``media/``); None when none of them may be judged (the reason is recorded)."""
    owner, _, kind = d.rpartition("/")
    where = scan.where(d)
    if kind == STORE_MEDIA_POOL:
        beside = [b for b in _beside(scan, owner) if b.key != owner]
        if any((b.pointer_key and not b.readable) or b.pending_bad for b in beside):
            plan.skip(UNJUDGED, where, len(keys))
            return None
        users = [b for b in beside if b.readable and b.shared]
        if not users:
            plan.skip(NOT_OURS_POOL, where, len(keys))
            return None
        return set().union(*(b.listed for b in users), *(b.pending for b in beside))
    b = scan.found.get(owner, _Bundle(owner))
    if (b.pointer_key and not b.readable) or b.pending_bad:
        plan.skip(UNJUDGED, where, len(keys))
        return None
    if b.readable:
        return (b.listed if not b.shared else set()) | b.pending
    if b.plain:
        unlisted = sum(k.rpartition("/")[2] not in b.listed for k in keys)
        if unlisted:
            plan.skip(PLAIN_COPY, where, unlisted)
        return None
    if b.generations:
        return b.pending  # a writer that died before publishing (or is about to)
    plan.skip(NOT_OURS_MEDIA, where, len(keys))
    return None


def _beside(scan: _Scan, parent: str) -> list[_Bundle]:
    return [b for b in scan.found.values() if _parent(b.key) == parent]


def _plan_media(scan: _Scan, plan: _Plan) -> None:
    """Doom the media of ours that no live (or about to be live) manifest lists."""
    dirs: dict[str, list[str]] = {}
    for key in scan.by_key:
        d, _, name = key.rpartition("/")
        if d.rpartition("/")[2] in (MEDIA_DIR, STORE_MEDIA_POOL) and layout_name_ok(f"{MEDIA_DIR}/{name}"):
            dirs.setdefault(d, []).append(key)
    for d, keys in sorted(dirs.items()):
        owner, _, kind = d.rpartition("/")
        if not _under(owner, scan.url.key):
            plan.skip(OUTSIDE, scan.where(d), len(keys))
            continue
        listed = _listed_for(scan, plan, d, keys)
        if listed is None:
            continue
        garbage = [k for k in sorted(keys) if k.rpartition("/")[2] not in listed]
        pooled = kind == STORE_MEDIA_POOL
        mine = [k for k in garbage if _sweep(scan, plan, None if pooled else owner, [k])]
        if pooled and mine:
            plan.pools[d] = mine
        else:
            plan.report.media.extend(mine)


def _recheck_pools(scan: _Scan, plan: _Plan) -> None:
    """Read the pointers beside each pool again just before deleting from it; a pool beside which
    one appeared or changed is left for the next run (a writer that reused its objects)."""
    for d, keys in plan.pools.items():
        owner = d.rpartition("/")[0]
        fault_point("gc.before-recheck", scan.where(d))
        before = {
            _join(b.key, STORE_POINTER_NAME): b.etag
            for b in _beside(scan, owner)
            if b.key != owner and b.pointer_key
        }
        names = [n for n in scan.store.children(owner) if n != STORE_MEDIA_POOL]
        now_tags = _pointer_tags(scan.store, owner, names)
        if now_tags != before:
            plan.unplan(scan, keys, CHANGED, scan.where(d))
            continue
        plan.report.media.extend(keys)


def _recheck_bundles(scan: _Scan, plan: _Plan) -> None:
    """Read the pointer of each bundle whose generations or media are doomed again just before
    deleting: a pointer that appeared or changed since gc read it (a writer published meanwhile)
    may name a doomed generation, which is never garbage, so that bundle is left whole."""
    owners = sorted(plan.owners)
    fault_point("gc.before-delete", scan.where(scan.url.key))
    metas = parallel(scan.store.head, [_join(u, STORE_POINTER_NAME) for u in owners])
    doomed = set(plan.doomed)
    for u, meta in zip(owners, metas, strict=True):
        b = scan.found[u]
        now_tag = meta.get("e_tag") if meta else None
        if (meta is not None) != b.pointer_key or now_tag != (b.etag if b.pointer_key else None):
            mine = [k for k in plan.owners[u] if k in doomed]
            if mine:
                plan.unplan(scan, mine, CHANGED_POINTER, scan.where(u))


def collect_garbage(
    prefix_text: str,
    *,
    older_than_s: float = 24 * 3600.0,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> GarbageReport:
    """Remove, under ``prefix``, the generations no pointer names and the media no live manifest
    lists, when older than ``older_than_s`` on the store's clock and provably written by
    rollout-bundles (the rule of the module docstring). With ``dry_run``, report exactly what a
    run would remove.

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
    now = store_now(store, url)
    if now is None:
        if not dry_run:
            raise BundleError(f"{url}: gc cannot write to the store (access denied): nothing is deleted")
        now, report.clock = datetime.datetime.now(datetime.timezone.utc), "local"
    scan = _scan(store, url, now, older_than_s)
    report.bundles = _read_bundles(scan)
    plan = _Plan(report)
    _plan_generations(scan, plan)
    _plan_media(scan, plan)
    _recheck_pools(scan, plan)
    _recheck_bundles(scan, plan)
    report.skipped = [Skipped(r, w, n) for (r, w), n in sorted(plan.skipped.items())]
    if not dry_run and plan.doomed:
        plan.doomed.sort(key=lambda k: not k.endswith("/" + MANIFEST_NAME))  # a generation's manifest first
        with naming(url, "delete garbage"):
            store.delete(plan.doomed)
    return report
