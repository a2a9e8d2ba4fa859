"""Peak memory of reading one image referenced many times, packed vs directory (not a test).

    python benchmarks/bench_amplification.py [--mib 8] [--refs 150] [--dir bench-out/amplification]

One sample holds the same PIL image ``--refs`` times (stored once, as an ~``--mib`` MiB PNG of
noise, which does not compress). The bundle is written as a directory and packed into one
``.rbundle``. Each operation runs in a fresh subprocess, which reports its peak RSS
(``ru_maxrss``), on the directory and on the packed file read in place:

* ``samples()``: ``list(open_bundle(p).samples())``, images left unloaded (as a loader does);
* ``show``: ``rollout-bundle show P`` (stdout to /dev/null);
* ``view``: ``rollout-bundle view P -o report.html``.

The directory is the peer: its images read their file when pixels are needed, so its peak does
not grow with the number of references. The ratio packed/directory is the amplification
(issue 16 item 4: 1.29 GB for the packed file before the fix, 40-80 MB for the directory). The
baseline line is a Python that imports bundles, PIL and numpy and does nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, resource, subprocess, sys
op, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy, PIL.Image  # noqa: F401  (the baseline imports them too)
import bundles
if op == "samples":
    with bundles.open_bundle(path) as b:
        samples = list(b.samples())
    n = sum(len(s["images"]) for s in samples)
elif op == "show":
    from trainer_hooks.cli import main
    sys.stdout = open(os.devnull, "w")
    n = main(["show", path])
elif op == "view":
    from trainer_hooks.cli import main
    n = main(["view", path, "-o", out, "--no-progress"])
else:
    n = 0
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.__stdout__.write(json.dumps({"op": op, "result": n, "peak_mib": peak_kib / 1024}) + "\\n")
"""


def make_bundle(base: Path, mib: float, refs: int) -> tuple[Path, Path]:
    import numpy as np
    from PIL import Image

    import bundles

    side = int((mib * 1024 * 1024 / 3) ** 0.5)
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    directory = base / "bundle"
    bundles.write_bundle(
        directory, [{"images": [image] * refs}], kind="debug_dump", meta={}, overwrite=True, progress=False
    )
    packed = bundles.pack_bundle(directory, base / "bundle.rbundle", overwrite=True, progress=False)
    return directory, packed


def measure(op: str, path: Path, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, op, str(path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{op} {path}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=8.0, help="size of the PNG (noise, so it does not compress)")
    ap.add_argument("--refs", type=int, default=150, help="references to it in the one sample")
    ap.add_argument("--dir", type=Path, default=Path("bench-out/amplification"))
    ns = ap.parse_args()
    ns.dir.mkdir(parents=True, exist_ok=True)
    directory, packed = make_bundle(ns.dir, ns.mib, ns.refs)
    png = next((directory / "media").iterdir()).stat().st_size
    print(f"one PNG of {png / 2**20:.1f} MiB referenced {ns.refs} times by one sample")
    base = measure("baseline", directory, ns.dir / "x.html")["peak_mib"]
    print(
        f"{'operation':<10} {'directory':>12} {'packed':>12} {'packed/dir':>11}   (peak RSS; baseline {base:.0f} MiB)"
    )
    for op in ("samples", "show", "view"):
        d = measure(op, directory, ns.dir / "dir.html")["peak_mib"]
        p = measure(op, packed, ns.dir / "packed.html")["peak_mib"]
        print(f"{op:<10} {d:>8.0f} MiB {p:>8.0f} MiB {p / d:>10.2f}x")


if __name__ == "__main__":
    main()
