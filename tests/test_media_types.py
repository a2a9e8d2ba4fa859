"""Media keep their type through a bundle: a path string comes back a path string, a MediaRef a
MediaRef (issue 9, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import put_media

from bundles import BundleError, MediaMissingError, MediaRef, open_bundle, write_bundle

REPO = Path(__file__).resolve().parents[1]


def test_path_strings_and_media_refs_keep_their_type(tmp_path):
    run = tmp_path / "run"
    path = put_media(run, b"\x89PNG shot")
    ref = MediaRef.from_file(put_media(run, b"\x89PNG other"))
    write_bundle(tmp_path / "b", [{"images": [path, ref], "note": "plain"}], media_roots=[run])
    (row,) = open_bundle(tmp_path / "b").samples()
    got_path, got_ref = row["images"]
    assert type(got_path) is str and Path(got_path).read_bytes() == b"\x89PNG shot"
    assert Path(got_path).is_relative_to(tmp_path / "b")
    assert type(got_ref) is MediaRef and got_ref.digest == ref.digest
    assert row["note"] == "plain"


def test_missing_media_keep_leaves_the_string(tmp_path):
    run = tmp_path / "run"
    present = put_media(run, b"there")
    gone = str(run / "gone.png")
    with pytest.raises(
        MediaMissingError, match=r"samples\[0\]\.images\[1\]: media file .*gone\.png does not exist"
    ):
        write_bundle(tmp_path / "b", [{"images": [present, gone]}], media_roots=[run])
    write_bundle(tmp_path / "b", [{"images": [present, gone]}], media_roots=[run], missing_media="keep")
    (row,) = open_bundle(tmp_path / "b").samples()
    assert row["images"][1] == gone and Path(row["images"][0]).read_bytes() == b"there"
    with pytest.raises(BundleError, match="missing_media: expected 'error' or 'keep'"):
        write_bundle(tmp_path / "c", [], missing_media="drop")


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGB", "RGBA", "I;16"])
def test_pil_images_come_back_as_pil_images_losslessly(tmp_path, mode):
    Image = pytest.importorskip("PIL.Image")
    np = pytest.importorskip("numpy")
    if mode == "I;16":
        img = Image.fromarray(np.arange(0, 60000, 2000, dtype=np.uint16).reshape(5, 6))
    else:
        base = Image.new("RGB", (6, 5))
        base.putdata([(x * 40, y * 50, (x * y) % 256) for y in range(5) for x in range(6)])
        img = base.convert(mode)
    write_bundle(tmp_path / "b", [{"images": [img, img]}])
    bundle = open_bundle(tmp_path / "b", verify="full")
    assert len(bundle.media) == 1  # the same image object is stored once
    (row,) = bundle.samples()
    for back in row["images"]:
        assert isinstance(back, Image.Image)
        assert (back.mode, back.size) == (img.mode, img.size)
        assert back.tobytes() == img.tobytes() and back.getpalette() == img.getpalette()
    assert row["images"][0] is not row["images"][1]  # each value its own (mutable) image


def test_images_png_cannot_hold_exactly_are_refused_naming_the_key(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    from bundles import UnsupportedValueError

    with pytest.raises(
        UnsupportedValueError, match=r"samples\[0\]\.mm\.images\[0\]: PIL image of mode 'CMYK'"
    ):
        write_bundle(tmp_path / "b", [{"mm": {"images": [Image.new("CMYK", (2, 2))]}}])
    with pytest.raises(UnsupportedValueError, match=r"mode 'F'"):
        write_bundle(tmp_path / "b", [{"x": Image.new("F", (2, 2))}])
    assert not (tmp_path / "b").exists()


def test_reading_many_images_holds_no_file_descriptors(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rows = [{"img": Image.new("RGB", (3, 3), (i, 0, 0))} for i in range(200)]
    write_bundle(tmp_path / "b", rows)
    fds = len(os.listdir("/proc/self/fd"))
    loaded = list(open_bundle(tmp_path / "b").samples())
    assert len(os.listdir("/proc/self/fd")) <= fds + 2  # not one per image
    assert [r["img"].getpixel((1, 1)) for r in loaded[:3]] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]


def test_images_of_a_packed_bundle_read_in_place(tmp_path):
    # A packed bundle's media are tar members, not files: its images decode from the member's
    # bytes, and stay readable after the bundle (and its descriptor) is closed.
    Image = pytest.importorskip("PIL.Image")
    from bundles import BundleFormatError, pack_bundle

    rows = [{"i": i, "img": Image.new("RGB", (3, 2), (i, 7, 9))} for i in range(3)]
    packed = pack_bundle(write_bundle(tmp_path / "b", rows), tmp_path / "b.rbundle")
    with open_bundle(packed, verify="full") as bundle:
        loaded = list(bundle.samples())
        one = bundle[1]["img"]
    assert [r["img"].getpixel((2, 1)) for r in loaded] == [(0, 7, 9), (1, 7, 9), (2, 7, 9)]
    assert one.size == (3, 2) and one.tobytes() == rows[1]["img"].tobytes()
    assert loaded[0]["img"].filename.startswith(f"{packed}/media/")
    # A stored member that is no PNG is the bundle's error, naming the sample and key path.
    bad = tmp_path / "bad"
    write_bundle(bad, [{"img": Image.new("L", (2, 2))}])
    (media,) = (bad / "media").iterdir()
    os.chmod(media, 0o644)
    media.write_bytes(b"\0" * media.stat().st_size)
    import shutil
    import tarfile

    with tarfile.open(tmp_path / "bad.rbundle", "w", format=tarfile.USTAR_FORMAT) as tar:
        for path in sorted(bad.rglob("*")):
            tar.add(path, str(path.relative_to(bad)), recursive=False)
    shutil.rmtree(bad)
    with pytest.raises(
        BundleFormatError, match=r"bad\.rbundle/samples/000000\.msgpack\.zst: samples\[0\]\.img: stored image"
    ):
        list(open_bundle(tmp_path / "bad.rbundle").samples())


def test_without_pillow_an_image_comes_back_as_a_media_ref(tmp_path):
    """Pillow made unimportable in a subprocess (an import hook refusing PIL, as an environment
    without it would)."""
    Image = pytest.importorskip("PIL.Image")
    write_bundle(tmp_path / "b", [{"img": Image.new("RGB", (3, 2), (9, 9, 9))}])
    script = f"""
import sys
class NoPIL:
    def find_spec(self, name, path=None, target=None):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("no Pillow here")
sys.meta_path.insert(0, NoPIL())
from bundles import MediaRef, open_bundle
(row,) = open_bundle({str(tmp_path / "b")!r}).samples()
assert type(row["img"]) is MediaRef and row["img"].suffix == ".png", row
print(open(row["img"].path, "rb").read(8))
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(b"\x89PNG\r\n\x1a\n")


def test_show_renders_images_and_records(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    from bundles import Record
    from bundles._commands.show import to_json

    write_bundle(tmp_path / "b", [{"img": Image.new("L", (2, 3)), "r": Record("x.Y", {"a": 1})}])
    bundle = open_bundle(tmp_path / "b")
    (row,) = bundle.samples()
    shown = to_json(row, media_prefix=str(bundle.path / "media") + os.sep)
    assert shown["img"] == {
        "type": "image",
        "mode": "L",
        "size": [2, 3],
        "media": f"media/{bundle.media[0].filename}",
    }
    assert shown["r"] == {"type": "record", "name": "x.Y", "fields": {"a": 1}}
