"""Structure-aware fuzzing: mutate a valid manifest as JSON (fields, types, values) and a valid
packed file member by member, so that most examples get past the first parser (json.loads, the
tar index) and reach validation, verification and decoding.

Whatever the mutation, every reader (open at each level, samples, rehydrate, inspect, unpack)
raises nothing but a BundleError, no example runs longer than ``HANG_S`` seconds, and the Python
heap (tracemalloc: every bytes object, list and numpy array built) never grows by more than
``MEMORY_BOUND`` bytes in one example. ``test_the_fuzzers_reach_past_the_first_parser`` checks
and prints how deep the examples got (``FUZZ_EXAMPLES`` sets how many, default 150 each).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import signal
import tarfile
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import put_media
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import BundleError, MediaRef, open_bundle, pack_bundle, unpack_bundle, write_bundle
from bundles._local.archive import read_tar_index
from bundles.cli import main

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
HANG_S = 30
MEMORY_BOUND = 64 * 1024 * 1024
STATS: dict[str, Counter[str]] = {"manifest": Counter(), "packed": Counter()}
# Messages of refusals by json.loads and the encoding checks before it: the "first parser".
FIRST_PARSER = ("not valid JSON", "not UTF-8", "byte order mark", "nested deeper")


# -- the valid starting point --------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fuzz-base")
    run = root / "run"
    shots = [put_media(run, bytes([i]) * (700 + i)) for i in range(3)]
    samples = [
        {
            "index": i,
            "prompt": "open the settings",
            "tokens": list(range(20 + i)),
            "images": shots[: i + 1],
            "ref": MediaRef.from_file(shots[i]),
            "reward": (1.0, None, True),
            "log_probs": np.arange(4, dtype=np.float32),
        }
        for i in range(3)
    ]
    bundle = write_bundle(root / "b", samples, media_roots=[run])
    packed = pack_bundle(bundle, root / "b.rbundle")
    with tarfile.open(packed) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    return {
        "dir": bundle,
        "manifest": json.loads((bundle / "manifest.json").read_text()),
        "members": members,
        "scratch": root,
    }


# -- running one example: only BundleError, no hang, bounded memory -------------------------------
class Hang(Exception):
    pass


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"an example ran longer than {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < MEMORY_BOUND, f"one example's Python heap peaked at {peak} bytes"
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exercise(path: Path, scratch: Path, stats: Counter[str]) -> None:
    """Every reader on ``path``; count how far it got. Anything but a BundleError fails."""
    try:
        bundle = open_bundle(path, verify="none")
    except BundleError as e:
        if "manifest.json" not in str(e):
            stats["refused before the manifest"] += 1
        elif any(s in str(e) for s in FIRST_PARSER):
            stats["refused by the JSON parser"] += 1
        else:
            stats["refused by manifest validation"] += 1
        return
    stats["manifest accepted"] += 1
    with bundle:
        # What inspect shows must work on anything open accepted.
        repr(bundle), len(bundle), bundle.kind, bundle.meta, bundle.media_bytes, bundle.media_references
        assert main(["inspect", "--json", str(path)]) == 0
        bundle.problems(full=True)
        try:
            bundle.verify("full", progress=False)
            stats["verified"] += 1
        except BundleError:
            pass
        try:
            for _ in bundle.samples():
                pass
            stats["every sample decoded"] += 1
        except BundleError:
            return
        target = scratch / "rehydrated"
        with contextlib.suppress(BundleError):
            bundle.rehydrate(target, progress=False)
        shutil.rmtree(target, ignore_errors=True)


# -- manifest mutations --------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63)])
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(
        [
            "",
            "../x",
            "/etc/passwd",
            ".png",
            "sha256:" + "0" * 64,
            "samples/000001.msgpack.zst",
            "é",
            "a" * 300,
        ]
    )
    | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
# "meta" and "unknown" change what readers must accept (free meta, unknown fields): they keep a
# share of the examples valid, so that verification and decoding see mutated manifests too.
ACTIONS = [
    "replace",
    "replace",
    "retype",
    "delete",
    "bump",
    "bump",
    "duplicate",
    "swap",
    "borrow",
    "add_key",
    "meta",
    "meta",
    "unknown",
]
mutation = st.tuples(st.integers(0, 10**6), st.sampled_from(ACTIONS), json_values, st.integers(-3, 3))


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _retyped(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return str(v) if v % 2 else float(v)
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 1e300 else str(v)
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return {str(i): x for i, x in enumerate(v)}
    if isinstance(v, dict):
        return list(v.values())
    return 0


def mutate_json(doc: Any, mutations: list[tuple[int, str, Any, int]]) -> Any:
    doc = copy.deepcopy(doc)
    for pick, action, value, delta in mutations:
        paths = _paths(doc)
        path = paths[pick % len(paths)]
        if action in ("meta", "unknown") and isinstance(doc, dict):
            target = doc.get("meta") if action == "meta" else doc
            if isinstance(target, dict):
                target[f"fuzz{delta}"] = value
            continue
        if not path:  # the document itself
            doc = value if action == "replace" else _retyped(doc) if action == "retype" else doc
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        old = parent[key]
        if action == "replace":
            parent[key] = value
        elif action == "retype":
            parent[key] = _retyped(old)
        elif action == "delete":
            del parent[key]
        elif action == "bump":
            parent[key] = old + delta if type(old) is int else [0, -1, 2**63, 2**70][delta % 4]
        elif action == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(old))
        elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
            other = (key + 1 + delta % (len(parent) - 1)) % len(parent)
            parent[key], parent[other] = parent[other], parent[key]
        elif action == "borrow":  # another field's value of the same document (cross-field confusion)
            parent[key] = copy.deepcopy(_get(doc, paths[(pick * 7 + 3) % len(paths)]))
        elif action == "add_key" and isinstance(old, dict):
            old[f"x{delta}"] = value
    return doc


def encode_json(doc: Any, encoding: str) -> bytes:
    text = json.dumps(doc, allow_nan=True)
    if encoding == "utf-8-sig":
        return b"\xef\xbb\xbf" + text.encode()
    return text.encode(encoding)


@FUZZ
@given(
    mutations=st.lists(mutation, min_size=1, max_size=3),
    encoding=st.sampled_from(["utf-8"] * 18 + ["utf-16", "utf-8-sig"]),
)
def test_fuzz_manifest_as_json(base, tmp_path_factory, mutations, encoding):
    scratch = tmp_path_factory.mktemp("fm")
    b = scratch / "b"
    shutil.copytree(base["dir"], b)
    os.chmod(b / "manifest.json", 0o644)
    (b / "manifest.json").write_bytes(encode_json(mutate_json(base["manifest"], mutations), encoding))
    STATS["manifest"]["examples"] += 1
    with guarded():
        exercise(b, scratch, STATS["manifest"])
    shutil.rmtree(scratch, ignore_errors=True)


# -- packed-file mutations, member by member -------------------------------------------------------
MEDIA_NAME = "media/" + "cd" * 32 + ".png"
NAMES = [
    "../x",
    "/etc/passwd",
    "media",
    "samples",
    "manifest.json",
    "media/x/y",
    "./manifest.json",
    "media\\..\\x",
    MEDIA_NAME,
    "samples/000001.msgpack.zst",
    "a" * 150,
    "samples/000000.msgpack.zst",
]
TYPES = [
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.FIFOTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
    tarfile.DIRTYPE,
    tarfile.CONTTYPE,
    tarfile.GNUTYPE_SPARSE,
    tarfile.REGTYPE,
    tarfile.AREGTYPE,
]
MEMBER_ACTIONS = (
    ["manifest"] * 6
    + ["flip"] * 3
    + ["truncate", "extend", "drop", "duplicate", "move", "rename", "retype", "pax"]
)
member_mutation = st.tuples(
    st.sampled_from(MEMBER_ACTIONS),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.lists(mutation, min_size=1, max_size=2),
    st.binary(max_size=40),
)


def mutate_members(base: dict[str, Any], mutations: list) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    members = [(copy.copy(m), d) for m, d in base["members"]]
    for action, i, j, json_mutations, blob in mutations:
        if not members:
            break
        k = i % len(members)
        info, data = members[k]
        info = copy.copy(info)
        if action == "manifest":
            k = next((n for n, (m, _) in enumerate(members) if m.name == "manifest.json"), k)
            info = copy.copy(members[k][0])
            data = json.dumps(mutate_json(base["manifest"], json_mutations), allow_nan=True).encode()
        elif action == "flip" and data:
            pos = j % len(data)
            data = data[:pos] + bytes([data[pos] ^ (1 + j % 255)]) + data[pos + 1 :]
        elif action == "truncate" and data is not None:
            data = data[: j % (len(data) + 1)]
        elif action == "extend" and data is not None:
            data = data + blob
        elif action == "drop":
            del members[k]
            continue
        elif action == "duplicate":
            members.insert(j % (len(members) + 1), (copy.copy(info), data))
        elif action == "move":
            del members[k]
            members.insert(j % (len(members) + 1), (info, data))
            continue
        elif action == "rename":
            info.name = NAMES[j % len(NAMES)]
        elif action == "retype":
            info.type = TYPES[j % len(TYPES)]
            info.linkname = "manifest.json"
            data = None if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) else (data or b"")
        elif action == "pax":
            info.pax_headers = [
                {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": str(2**30)},
                {"path": "../../x"},
                {"size": str(2**40)},
                {"comment": blob.hex()},
            ][j % 4]
        members[k] = (info, data)
    return members


def serialize(
    members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int, tail: int, blob: bytes
) -> bytes | None:
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
            for info, data in members:
                if data is not None:
                    info.size = len(data)
                tar.addfile(info, None if data is None else io.BytesIO(data))
    except (ValueError, tarfile.TarError, UnicodeError):
        return None  # tarfile cannot write this header in this format
    raw = out.getvalue()
    if tail > 0:
        return raw[: max(0, len(raw) - tail)]
    return raw + blob if tail < 0 else raw


@FUZZ
@given(
    mutations=st.lists(member_mutation, min_size=1, max_size=3),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    tail=st.sampled_from([0] * 8 + [1, 600, 11000, -1]),
    blob=st.binary(min_size=1, max_size=600),
)
def test_fuzz_packed_file_member_by_member(base, tmp_path_factory, mutations, fmt, tail, blob):
    data = serialize(mutate_members(base, mutations), fmt, tail, blob)
    if data is None:
        STATS["packed"]["not writable by tarfile"] += 1
        return
    scratch = tmp_path_factory.mktemp("fp")
    packed = scratch / "x.rbundle"
    packed.write_bytes(data)
    STATS["packed"]["examples"] += 1
    with guarded():
        fd = os.open(packed, os.O_RDONLY)
        try:
            read_tar_index(fd, packed)
            STATS["packed"]["past the tar index"] += 1
        except BundleError:
            pass
        finally:
            os.close(fd)
        exercise(packed, scratch, STATS["packed"])
        try:
            unpack_bundle(packed, scratch / "out", progress=False)
            STATS["packed"]["unpacked"] += 1
        except BundleError:
            assert not (scratch / "out").exists()
    shutil.rmtree(scratch, ignore_errors=True)


def test_the_fuzzers_reach_past_the_first_parser(capsys):
    """Runs after the two fuzzers above (file order): most examples must get past the first
    parser, or the fuzzing has degenerated into testing json.loads and tarfile."""
    m, p = STATS["manifest"], STATS["packed"]
    if not m["examples"] or not p["examples"]:
        pytest.skip("run with the fuzzers above")
    with capsys.disabled():
        print(f"\nmanifest fuzzing: {dict(m)}\npacked fuzzing: {dict(p)}")
    # Most manifests get past json.loads (the first parser); the validator refuses many of the
    # rest, and what it accepts is verified and decoded.
    assert 1 - m["refused by the JSON parser"] / m["examples"] >= 0.75
    assert m["manifest accepted"] / m["examples"] >= 0.1
    assert p["past the tar index"] / p["examples"] >= 0.5
    assert p["manifest accepted"] / p["examples"] >= 0.1
