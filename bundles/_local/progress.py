"""A dependency-free progress line for long work: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from bundles._format.repr import display

__all__ = ["Progress", "human_bytes"]


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: the one size format of every command's output."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """``with Progress("verify", total=n_bytes, unit="B") as bar: bar.advance(k)``.

    ``enabled=None`` draws only when the stream is a terminal, so logs and CI stay clean.
    ``desc`` is shown through :func:`bundles._format.repr.display` (it names a bundle, an untrusted name).
    Redraws are throttled to ten a second; the cost when disabled is one attribute check.
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        unit: str = "",
        enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.desc = display(desc)  # names a bundle or an object: untrusted, one line
        self.total = total
        self.unit = unit
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._drawn = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._last_draw >= 0.1:
                self._last_draw = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        if self.unit == "B":
            rate = f"{human_bytes(self.done / elapsed)}/s"
            count = (
                f"{human_bytes(self.done)}/{human_bytes(self.total)}"
                if self.total
                else human_bytes(self.done)
            )
        else:  # counted things: "3/20 samples 1.5/s"
            unit = f" {self.unit}" if self.unit else ""
            rate = f"{self.done / elapsed:.1f}/s"
            count = f"{self.done}/{self.total}{unit}" if self.total else f"{self.done}{unit}"
        if self.total:
            frac = min(self.done / self.total, 1.0)
            line = f"{self.desc} [{'#' * int(frac * 30):<30}] {frac:6.1%} {count} {rate}"
        else:
            line = f"{self.desc} {count} {rate}"
        line = line[:120]
        # Pad over the end of a longer previous line (a rate that lost a digit).
        self.stream.write("\r" + line.ljust(self._drawn))
        self._drawn = len(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
