"""Synthetic 1920x1080 desktop screenshots.

Shared by ``examples/demo.py`` and ``benchmarks/bench_save.py``. A screenshot is a desktop
(wallpaper, taskbar, a few windows with text) plus one "photo" window of seeded noise: real
screenshots with photos or video in them are around 1 MB as PNG, and noise is what keeps a
synthetic one from compressing to a few kilobytes. Everything is derived from ``seed``, so
the same seed gives the same bytes and so the same content-addressed name.
"""

from __future__ import annotations

import io
import random
from argparse import Namespace
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

import trainer_hooks

WIDTH, HEIGHT = 1920, 1080

_WORDS = [
    "rollout",
    "reward",
    "policy",
    "tokens",
    "sample",
    "trajectory",
    "screenshot",
    "click",
    "scroll",
    "browser",
    "terminal",
    "settings",
    "file",
    "edit",
    "view",
    "window",
    "search",
    "open",
    "save",
    "close",
    "submit",
    "cancel",
    "login",
    "profile",
]


def render_screenshot(seed: int, *, noise_pixels: int = 340_000) -> bytes:
    """PNG bytes of one desktop screenshot. ``noise_pixels`` sets the photo area and so the size
    (about 3 bytes per noise pixel; the default lands near 1 MB)."""
    rng = random.Random(seed)
    img = Image.new("RGB", (WIDTH, HEIGHT))
    draw = ImageDraw.Draw(img)

    # Wallpaper: a vertical gradient in a seeded hue.
    top = (rng.randrange(20, 80), rng.randrange(40, 120), rng.randrange(90, 180))
    for y in range(0, HEIGHT, 4):
        t = y / HEIGHT
        draw.rectangle((0, y, WIDTH, y + 3), fill=tuple(int(c * (1 - 0.6 * t)) for c in top))

    font = ImageFont.load_default(size=16)
    title_font = ImageFont.load_default(size=18)

    # Windows: title bar, buttons, lines of text.
    for w in range(rng.randrange(2, 5)):
        x0, y0 = rng.randrange(0, WIDTH - 700), rng.randrange(0, HEIGHT - 500)
        x1, y1 = x0 + rng.randrange(500, 700), y0 + rng.randrange(300, 450)
        draw.rectangle((x0 + 6, y0 + 6, x1 + 6, y1 + 6), fill=(20, 20, 20))  # shadow
        draw.rectangle((x0, y0, x1, y1), fill=(245, 245, 245), outline=(90, 90, 90))
        draw.rectangle((x0, y0, x1, y0 + 32), fill=(60, 64, 72))
        draw.text(
            (x0 + 12, y0 + 6), f"Window {seed}.{w} — {rng.choice(_WORDS)}", fill="white", font=title_font
        )
        for i, colour in enumerate(((237, 106, 94), (245, 191, 79), (98, 197, 84))):
            cx = x1 - 20 - 26 * i
            draw.ellipse((cx - 8, y0 + 8, cx + 8, y0 + 24), fill=colour)
        y = y0 + 44
        while y < y1 - 66:  # stop above the buttons
            line = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(3, 9)))
            draw.text((x0 + 14, y), line, fill=(30, 30, 30), font=font)
            y += 22
        bx = x0 + 14
        for label in ("OK", "Cancel"):
            draw.rounded_rectangle((bx, y1 - 40, bx + 90, y1 - 12), 6, fill=(66, 133, 244))
            draw.text((bx + 22, y1 - 36), label, fill="white", font=font)
            bx += 100

    # "Photo" window: seeded noise, the part that makes the PNG realistically large.
    side_w = min(WIDTH - 40, max(64, int((noise_pixels * 16 / 9) ** 0.5)))
    side_h = max(36, noise_pixels // side_w)
    px, py = rng.randrange(0, WIDTH - side_w), rng.randrange(0, HEIGHT - 48 - side_h)
    noise = Image.frombytes("RGB", (side_w, side_h), rng.randbytes(side_w * side_h * 3))
    img.paste(noise, (px, py))
    draw.rectangle((px, py, px + side_w, py + side_h), outline=(200, 200, 200), width=2)

    # Taskbar with a clock.
    draw.rectangle((0, HEIGHT - 48, WIDTH, HEIGHT), fill=(32, 32, 36))
    for i in range(6):
        draw.rounded_rectangle((12 + 56 * i, HEIGHT - 42, 52 + 56 * i, HEIGHT - 6), 6, fill=(70, 70, 80))
    draw.text((WIDTH - 90, HEIGHT - 34), f"{seed % 24:02d}:{seed % 60:02d}", fill="white", font=font)

    out = io.BytesIO()
    # compress_level 1: noise does not compress anyway, and level 6 is several times slower.
    img.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def store_media(run_dir: Path, data: bytes, suffix: str = ".png") -> Path:
    """Store ``data`` in ``run_dir`` as ``<sha256 hex><suffix>``; return the file's absolute path.

    A path-based shim over :func:`trainer_hooks.store_media` (atomic, idempotent, read-only), for
    callers such as ``benchmarks/bench_save.py`` that hold a directory rather than parsed run
    arguments: ``run_dir``'s parent plays ``--shared-media-dir`` and its name ``--run-uuid``.
    """
    run_dir = Path(run_dir).absolute()
    args = Namespace(shared_media_dir=str(run_dir.parent), run_uuid=run_dir.name)
    ref = trainer_hooks.store_media(args, data, suffix)
    assert ref.path is not None  # store_media always sets it
    return Path(ref.path)
