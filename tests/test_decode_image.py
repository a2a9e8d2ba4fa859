"""bundles.decode_image: the one decoder of untrusted image bytes (view, replay)."""

from __future__ import annotations

import io

import pytest

from bundles import DECODABLE_IMAGE_FORMATS, BundleFormatError, decode_image

Image = pytest.importorskip("PIL.Image")


def _encoded(fmt: str, size=(8, 4), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (10, 20, 30)).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", DECODABLE_IMAGE_FORMATS)
def test_allowed_formats_decode(fmt):
    image = decode_image(_encoded(fmt), where="samples[0].images[0]")
    assert image.size == (8, 4)
    assert image.format == fmt


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "WEBP"])
def test_other_formats_are_refused_by_magic(fmt):
    with pytest.raises(BundleFormatError, match=r"samples\[2\]\.images\[0\]: not a PNG or JPEG image"):
        decode_image(_encoded(fmt), where="samples[2].images[0]")


def test_postscript_is_never_handed_to_pillow():
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(BundleFormatError, match=r"starts with b'%!PS-Ado'"):
        decode_image(eps, where="x")


def test_size_is_bounded_before_decoding():
    data = _encoded("PNG", size=(300, 200))
    with pytest.raises(BundleFormatError, match=r"300x200 pixels exceeds the decode limit of 1000 pixels"):
        decode_image(data, where="x", max_pixels=1000)


def test_png_magic_with_garbage_is_a_named_error():
    with pytest.raises(BundleFormatError, match=r"^img: cannot decode as PNG"):
        decode_image(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, where="img")


def test_truncated_png_is_a_named_error():
    data = _encoded("PNG", size=(64, 64))
    with pytest.raises(BundleFormatError, match=r"^img: cannot decode as PNG"):
        decode_image(data[: len(data) // 2], where="img")
