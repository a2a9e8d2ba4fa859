"""The manifest parsed through a window (``bundles._format.manifest``, issue 39, item 6): the same
manifests and the same refusals, with the same messages, as the parse of the whole text.

The window (``bundles._format.textwindow.WINDOW_BYTES``) is made a few bytes wide here, so that
every entry, number, escape and multibyte character of a small manifest meets its boundary
somewhere; the reference is the same parse with a window wider than the manifest (the whole text
at once), and, independently, ``json.loads``. A manifest that parses must be read once (a
second read means the window gave up and the whole text decided: a window that always gave up
would pass every comparison).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import BundleError, BundleFormatError, UnsafeBundleError
from bundles._format import manifest as manifest_module
from bundles._format import textwindow
from bundles._format.manifest import parse_manifest_bytes, parse_manifest_file

WHERE = "b/manifest.json"


@contextmanager
def window(size: int) -> Iterator[None]:
    saved = textwindow.WINDOW_BYTES
    textwindow.WINDOW_BYTES = size
    try:
        yield
    finally:
        textwindow.WINDOW_BYTES = saved


class CountingFile(io.BytesIO):
    """A file that counts the bytes read from it (a second pass reads them again)."""

    read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:
        chunk = super().read(n)
        self.read_bytes += len(chunk)
        return chunk


def outcome(parse: Any, raw: bytes) -> tuple[Any, ...]:
    """What a parse makes of ``raw``: the manifest as JSON and its media table's columns, or the
    refusal's type and message."""
    try:
        m = parse(raw)
    except BundleError as e:
        return ("refused", type(e).__name__, str(e))
    table = m.media
    columns = [(table.digest(i), table.size(i), table.suffix(i)) for i in range(len(table))]
    return ("parsed", json.dumps(m, sort_keys=True), columns, m.shards, m.sample_count)


def whole(raw: bytes) -> tuple[Any, ...]:
    with window(len(raw) + 1):
        return outcome(lambda r: parse_manifest_bytes(r, WHERE), raw)


def windowed(raw: bytes, size: int) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """The outcome from bytes and from a file through a window of ``size`` bytes, and how many
    bytes the file parse read."""
    f = CountingFile(raw)
    with window(size):
        from_bytes = outcome(lambda r: parse_manifest_bytes(r, WHERE), raw)
        from_file = outcome(lambda r: parse_manifest_file(f, WHERE), raw)
    return from_bytes, from_file, f.read_bytes


def agrees(raw: bytes, size: int) -> tuple[Any, ...]:
    """Assert the windowed parses agree with the whole one; return that outcome."""
    expected = whole(raw)
    from_bytes, from_file, read = windowed(raw, size)
    assert from_bytes == expected
    assert from_file == expected
    if expected[0] == "parsed":
        assert read == len(raw), "the window gave up on a manifest that parses"
        assert json.loads(expected[1]) == json.loads(raw)
    return expected


# -- manifests ------------------------------------------------------------------------------------
HEX = "0123456789abcdef"
texts = st.text(
    st.sampled_from(['"', "\\", "/", "\n", "\t", "\x01", "a", "é", "€", "😀", "\u2028", " ", "{", "]"]),
    max_size=12,
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
metas = st.dictionaries(
    texts, st.recursive(scalars, lambda c: st.lists(c, max_size=3), max_leaves=6), max_size=4
)
media_entries = st.lists(
    st.fixed_dictionaries(
        {
            "digest": st.text(st.sampled_from(HEX), min_size=64, max_size=64).map(lambda h: "sha256:" + h),
            "size": st.integers(0, 2**34),  # MAX_MEDIA_BYTES
            "suffix": st.sampled_from(["", ".png", ".jpg", ".tar.gz", ".A_b-9"]),
        }
    ),
    max_size=6,
    unique_by=lambda e: (e["digest"], e["suffix"]),
)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    """A valid manifest (its media sorted as a writer sorts them, or not), dumped compact, with
    spaces, or indented, ASCII-escaped or as UTF-8."""
    media: list[dict[str, Any]] = draw(media_entries)
    if draw(st.booleans()):
        media.sort(key=lambda e: (bytes.fromhex(e["digest"][7:]), e["suffix"]))
    samples = draw(st.integers(0, 50))
    m: dict[str, Any] = {
        "format": "rollout-bundle",
        "format_version": 1,
        "kind": draw(st.sampled_from(["debug_dump", "rollout", "k2"])),
        "meta": draw(metas),
        "sample_count": samples,
        "shards": [
            {
                "path": "samples/000000.msgpack.zst",
                "samples": samples,
                "size": 10,
                "raw_size": 99,
                "digest": "sha256:" + "ab" * 32,
            }
        ],
        "media": media,
    }
    if draw(st.booleans()):
        m["created_by"] = draw(texts)
    layout: dict[str, Any] = draw(
        st.sampled_from([{"separators": (",", ":")}, {}, {"indent": 1}, {"indent": "\t\r\n "}])
    )
    return json.dumps(m, ensure_ascii=draw(st.booleans()), **layout).encode()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=manifests(), size=st.integers(1, 48))
def test_a_manifest_parses_through_any_window_as_it_parses_whole(raw: bytes, size: int) -> None:
    assert agrees(raw, size)[0] == "parsed"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=manifests(), size=st.integers(1, 48), data=st.data())
def test_a_damaged_manifest_is_refused_through_any_window_as_whole(raw: bytes, size: int, data: Any) -> None:
    """Cut short, a byte changed, inserted or removed: the same outcome, the same message."""
    at = data.draw(st.integers(0, len(raw)))
    byte = bytes([data.draw(st.sampled_from(b'\x00\x80\xc3\xff"\\,:]}{[ 0e-.n'))])
    damaged = data.draw(
        st.sampled_from(
            [raw[:at], raw[:at] + byte + raw[at + 1 :], raw[:at] + byte + raw[at:], raw[:at] + raw[at + 1 :]]
        )
    )
    agrees(damaged, size)


def test_a_manifest_cut_anywhere_is_refused_with_json_loads_message() -> None:
    raw = json.dumps(
        {"format": "rollout-bundle", "format_version": 1, "kind": "k", "meta": {"t": "é😀\\\"x", "n": -1.5e-7},
         "sample_count": 12345, "shards": [], "media": [{"digest": "sha256:" + "0f" * 32, "size": 7, "suffix": ".png"}]},
        ensure_ascii=False,
    ).encode()  # fmt: skip
    for at in range(len(raw)):
        cut = raw[:at]
        try:
            json.loads(cut.decode("utf-8"))
        except UnicodeDecodeError as e:
            expected = f"{WHERE}: not UTF-8: {e}"
        except ValueError as e:
            expected = f"{WHERE}: not valid JSON: {e}"
        else:
            raise AssertionError(f"a prefix of {at} bytes parsed")
        for size in (1, 2, 3, 5, 64):
            with window(size), pytest.raises(BundleFormatError) as refused:
                parse_manifest_bytes(cut, WHERE)
            assert str(refused.value) == expected, (at, size)


def sized_manifest(meta: dict[str, Any], media: list[dict[str, Any]], **more: Any) -> bytes:
    return json.dumps(
        {"format": "rollout-bundle", "format_version": 1, "kind": "k", "meta": meta, "sample_count": 0,
         "shards": [], "media": media, **more},
        ensure_ascii=False, separators=(",", ":"),
    ).encode()  # fmt: skip


ENTRIES: list[dict[str, Any]] = [
    {"digest": "sha256:" + f"{k:02x}" * 32, "size": 1000 + k, "suffix": ".png"} for k in range(6)
]


def test_an_entry_across_every_window_boundary_parses_read_once() -> None:
    raw = sized_manifest({}, ENTRIES)  # entries of 90 bytes each, from byte 98 on
    for size in range(1, 140):  # each boundary somewhere inside an entry, a digest, a number
        assert agrees(raw, size)[2][5] == ("sha256:" + "05" * 32, 1005, ".png")


@pytest.mark.parametrize("value", ["é😀€", '\\"\n\t\u2028\x01', "a\\u00e9b", "\\ud83d\\ude00"])
def test_escapes_and_multibyte_characters_across_every_boundary(value: str) -> None:
    # Numbers outside an object too: the scanner reads ``1.5e-`` cut short as ``1.5``.
    raw = sized_manifest({"t": value}, ENTRIES[:2], x=-1.5e-300, y=12.25, z=[7.0e10, value])
    for size in range(1, 60):  # the window's end cuts each character's bytes, each escape
        assert json.loads(agrees(raw, size)[1])["meta"]["t"] == value


def test_a_bad_entry_at_the_end_and_a_repeat_refuse_the_manifest_through_a_window() -> None:
    bad = sized_manifest({}, [*ENTRIES, {"digest": "sha256:" + "ff" * 32, "size": -1, "suffix": ".png"}])
    for size in (3, 64, 4096):
        with window(size), pytest.raises(BundleFormatError) as refused:
            parse_manifest_bytes(bad, WHERE)
        assert str(refused.value) == f"{WHERE}: media[6].size: expected an int in [0, 2**63), found -1"
    repeat = sized_manifest({}, [*ENTRIES[:4], ENTRIES[1], *ENTRIES[4:]])
    with window(5), pytest.raises(BundleFormatError) as refused:
        parse_manifest_file(io.BytesIO(repeat), WHERE)
    assert str(refused.value) == f"{WHERE}: media[4]: sha256:{'01' * 32}.png is listed twice"
    unsorted = sized_manifest({}, [ENTRIES[3], ENTRIES[1], ENTRIES[2], ENTRIES[1]])
    with window(5), pytest.raises(BundleFormatError) as refused:
        parse_manifest_bytes(unsorted, WHERE)
    assert str(refused.value) == f"{WHERE}: media[3]: sha256:{'01' * 32}.png is listed twice"


def test_a_file_read_past_the_manifest_cap_is_refused_as_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = sized_manifest({"pad": "x" * 500}, ENTRIES)
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(raw) - 1)
    f = CountingFile(raw)
    with window(64), pytest.raises(UnsafeBundleError) as refused:
        parse_manifest_file(f, WHERE)
    assert str(refused.value) == f"{WHERE}: exceeds the manifest cap of {len(raw) - 1} bytes"
    assert f.read_bytes == len(raw)  # refused once past the cap, not after a second reading
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(raw))
    with window(64):
        assert len(parse_manifest_file(io.BytesIO(raw), WHERE).media) == len(ENTRIES)


def test_a_byte_order_mark_a_nul_and_utf16_are_refused_as_whole() -> None:
    raw = sized_manifest({}, ENTRIES[:1])
    cases = {
        b"\xef\xbb\xbf" + raw: f"{WHERE}: starts with a byte order mark; the manifest must be UTF-8 without one",
        raw[:-1] + b"\x00}": f"{WHERE}: not UTF-8 (a NUL byte or a UTF-16/32 byte order mark); the manifest must be UTF-8 JSON",
        raw.decode().encode("utf-16"): f"{WHERE}: not UTF-8 (a NUL byte or a UTF-16/32 byte order mark); the manifest must be UTF-8 JSON",
    }  # fmt: skip
    for bad, message in cases.items():
        for size in (1, 7, 4096):
            with window(size), pytest.raises(BundleFormatError) as refused:
                parse_manifest_file(io.BytesIO(bad), WHERE)
            assert str(refused.value) == message


def test_media_tables_compare_equal_exactly_when_their_lists_are() -> None:
    """A reader compares the manifest it opened with the one there now (a replaced bundle, or
    a damaged one?): equal exactly when the stored lists are, compared by columns."""
    a = parse_manifest_bytes(sized_manifest({}, ENTRIES), WHERE)
    assert a == parse_manifest_bytes(sized_manifest({}, ENTRIES), WHERE)
    changed = [
        [dict(e, size=e["size"] + 1) if k == 4 else e for k, e in enumerate(ENTRIES)],
        [dict(e, suffix=".jpg") if k == 2 else e for k, e in enumerate(ENTRIES)],
        [dict(e, digest="sha256:" + "ee" * 32) if k == 4 else e for k, e in enumerate(ENTRIES)],
        [dict(e, note=1) if k == 1 else e for k, e in enumerate(ENTRIES)],
        ENTRIES[:5],
        [ENTRIES[1], ENTRIES[0], *ENTRIES[2:]],
    ]
    for media in changed:
        b = parse_manifest_bytes(sized_manifest({}, media), WHERE)
        assert a.media != b.media and a != b and b.media == media and (a.media == b.media) is False
    jpg = [[dict(e, suffix=".jpg") if k == j else e for k, e in enumerate(ENTRIES)] for j in (1, 2)]
    one, two = (parse_manifest_bytes(sized_manifest({}, media), WHERE).media for media in jpg)
    assert one != two  # the same suffixes, met in the same order, on other entries


def test_a_value_past_the_cap_is_refused_having_read_the_cap_and_one_byte() -> None:
    """A value larger than the window doubles the reads; the last one still stops at the cap + 1
    (a manifest that grew after its size was checked: 2x the cap was read before, a review)."""
    cap = 4096
    raw = b'{"meta":{"s":"' + b"x" * (3 * cap) + b'"}}'
    f = CountingFile(raw)
    saved = manifest_module.MAX_MANIFEST_BYTES
    manifest_module.MAX_MANIFEST_BYTES = cap
    try:
        with window(256), pytest.raises(UnsafeBundleError, match="exceeds the manifest cap of 4096 bytes"):
            parse_manifest_file(f, WHERE)
    finally:
        manifest_module.MAX_MANIFEST_BYTES = saved
    assert f.read_bytes == cap + 1


def test_a_damaged_manifest_is_given_up_where_the_damage_is_not_read_to_its_end() -> None:
    """A JSON error well inside the window (a control character in a string) hands the manifest
    to the whole-text parse at once: the first pass reads one window, not the rest of the file
    (a review: a 40 MB manifest damaged near its start was read whole twice)."""
    raw = sized_manifest({"note": "bad-here", "pad": "x" * 20_000}, ENTRIES).replace(
        b"bad-here", b"bad\x01here"
    )
    f = CountingFile(raw)
    with window(256), pytest.raises(BundleFormatError) as refused:
        parse_manifest_file(f, WHERE)
    assert "Invalid control character" in str(refused.value)
    assert f.read_bytes <= 256 + len(raw)  # one window, then the whole-text parse's own read
    with window(256):
        assert outcome(lambda r: parse_manifest_file(io.BytesIO(r), WHERE), raw) == outcome(
            lambda r: parse_manifest_bytes(r, WHERE), raw
        )
