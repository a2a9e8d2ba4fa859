"""Generate trainer_hooks/data/sglang_generate_req_input_fields.json from a pinned sglang release.

The prefill payloads of :mod:`trainer_hooks.replay` must use SGLang's request field names. SGLang
cannot be installed here (it pulls CUDA), so this script reads the wheel's source as text and
parses ``sglang/srt/managers/io_struct.py`` with :mod:`ast`: never importing it. The fields of
``GenerateReqInput`` are its class-level annotated assignments (a dataclass), plus those of any
base class defined in the same module.

    pip download --no-deps sglang==0.5.23 -d /tmp/sg
    python scripts/sglang_fields.py /tmp/sg/sglang-0.5.23-*.whl          # writes the JSON
    python scripts/sglang_fields.py /tmp/sg/sglang-0.5.23-*.whl --check  # exit 1 if it differs

Without a wheel argument it runs the ``pip download`` above into a temporary directory.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PINNED = "0.5.23"
SOURCE = "sglang/srt/managers/io_struct.py"
CLASS = "GenerateReqInput"
# The one field the token-space engine build adds to GenerateReqInput (absent from stock sglang).
TOKEN_SPACE_ADDITIONS = ["mm_token_expansion_start_len"]
OUT = Path(__file__).resolve().parents[1] / "trainer_hooks" / "data" / "sglang_generate_req_input_fields.json"


def class_fields(tree: ast.Module, name: str) -> list[str]:
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if name not in classes:
        raise SystemExit(f"{SOURCE}: class {name} not found")
    fields: list[str] = []
    node = classes[name]
    for base in node.bases:  # bases defined in the same module first, as a dataclass orders them
        if isinstance(base, ast.Name) and base.id in classes:
            fields += [f for f in class_fields(tree, base.id) if f not in fields]
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            if not ann.startswith("ClassVar") and stmt.target.id not in fields:
                fields.append(stmt.target.id)
    return fields


def read_source(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(SOURCE).decode()


def build(wheel: Path) -> dict[str, object]:
    m = re.match(r"sglang-([^-]+)-", wheel.name)
    version = m.group(1) if m else "unknown"
    fields = class_fields(ast.parse(read_source(wheel)), CLASS)
    return {
        "generated_by": "scripts/sglang_fields.py",
        "sglang": version,
        "source": SOURCE,
        "class": CLASS,
        "fields": fields,
        "token_space_additions": TOKEN_SPACE_ADDITIONS,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "wheel", nargs="?", type=Path, help=f"an sglang=={PINNED} wheel (default: pip download it)"
    )
    p.add_argument("-o", "--output", type=Path, default=OUT)
    p.add_argument("--check", action="store_true", help="compare with --output instead of writing it")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = ns.wheel
        if wheel is None:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={PINNED}", "-d", tmp],
                check=True,
            )
            wheel = next(Path(tmp).glob("sglang-*.whl"))
        doc = build(wheel)
    text = json.dumps(doc, indent=1) + "\n"
    if ns.check:
        same = ns.output.exists() and ns.output.read_text() == text
        print(f"{ns.output}: {'up to date' if same else 'DIFFERS from ' + str(wheel)}")
        return 0 if same else 1
    ns.output.write_text(text)
    print(f"{ns.output}: {len(doc['fields'])} fields of {CLASS} from sglang {doc['sglang']}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
