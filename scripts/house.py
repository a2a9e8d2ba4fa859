"""The house in figures: import graph and sizes of the product packages, read from the code.

    python scripts/house.py                 # both packages, and the size limits
    python scripts/house.py bundles         # one package (or a folder of one: trainer_hooks/serve)
    python scripts/house.py --json

What it counts, for a folder: its modules (every ``.py`` below it), the entries at its top (modules
and folders), the imports between its modules (every import, inside functions too, counted once
per pair), its layers (the longest chain of imports, a module importing nothing of the folder
standing on layer 1), the circles, and the imports that run back up (from a lower layer to a
higher one: none where there is no circle). Importing a package counts as importing its
``__init__``; a module importing its own package's ``__init__`` (to reach a sibling's name) is not
an arrow. Sizes: files over 600 lines, classes over 400, functions over 60 (with whether their
docstring says why they cannot be split). ``docs/ARCHITECTURE.md`` quotes these figures and
``tests/test_house.py`` holds the house to its limits; both read them through :func:`measure`.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bundles", "trainer_hooks")
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 400
LONG_FUNCTION_LINES = 60


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, importer: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that a module imports (relative imports resolved)."""
    found: set[str] = set()
    base = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                module = ".".join(anchor + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # the longest known module this name is, or lies in
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                candidate = ".".join(parts[:i])
                if candidate in known:
                    found.add(candidate)
                    break
    return found


def graph(folder: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``folder`` it imports."""
    files = sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)
    known = {module_name(p, root) for p in files}
    edges: dict[str, set[str]] = {}
    for path in files:
        name = module_name(path, root)
        deps = _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known)
        # a module reaching its own package (or an ancestor) through its __init__ is no arrow
        edges[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                found.append([*stack[stack.index(d) :], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def layers(edges: dict[str, set[str]]) -> dict[str, int]:
    """Module -> its layer (1 + the highest layer it imports); a circle is cut where it closes."""
    layer: dict[str, int] = {}
    on_path: set[str] = set()

    def of(m: str) -> int:
        if m in layer:
            return layer[m]
        on_path.add(m)
        below = [of(d) for d in edges.get(m, ()) if d not in on_path]
        on_path.discard(m)
        layer[m] = 1 + max(below, default=0)
        return layer[m]

    for m in sorted(edges):
        of(m)
    return layer


def sizes(folder: Path, root: Path = ROOT) -> dict[str, list]:
    files, classes, functions = [], [], []
    for path in sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        n = text.count("\n")
        if n > MAX_FILE_LINES:
            files.append([rel, n])
        for node in ast.walk(ast.parse(text, str(path))):
            length = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and length > MAX_CLASS_LINES:
                classes.append([f"{rel}:{node.lineno}: {node.name}", length])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and length > LONG_FUNCTION_LINES:
                why = "cannot be split" in (ast.get_docstring(node) or "")
                functions.append([f"{rel}:{node.lineno}: {node.name}", length, why])
    return {"files_over_600": files, "classes_over_400": classes, "functions_over_60": functions}


def collapse(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph of one package's rooms: its modules and its subpackages, each subpackage one
    room holding every module below it (the view of a reader who has not opened the folder).
    The package's own ``__init__`` is a room too; imports from outside the package are dropped."""
    depth = package.count(".") + 1

    def room(m: str) -> str | None:
        if m == package:
            return package
        if not m.startswith(package + "."):
            return None
        return ".".join(m.split(".")[: depth + 1])

    rooms: dict[str, set[str]] = {}
    for m, deps in edges.items():
        r = room(m)
        if r is None:
            continue
        rooms.setdefault(r, set())
        for d in deps:
            rd = room(d)
            # a room reaching its own package through the __init__ is no arrow (see graph())
            if rd is not None and rd != r and not (rd == package and m != package):
                rooms[r].add(rd)
    return rooms


def _shape(edges: dict[str, set[str]]) -> dict:
    layer = layers(edges)
    return {
        "imports": sum(len(d) for d in edges.values()),
        "layers": max(layer.values(), default=0),
        "circles": [" -> ".join(c) for c in circles(edges)],
        "back_up": sorted(f"{m} -> {d}" for m, deps in edges.items() for d in deps if layer[d] >= layer[m]),
    }


def measure(folder: str, root: Path = ROOT) -> dict:
    """The figures of ``folder`` (see the module docstring): ``top`` is the folder as its rooms
    (subfolders closed), ``packages`` the same for every package below it."""
    path = root / folder
    edges = graph(path, root)
    package = folder.replace("/", ".")
    packages = sorted(
        module_name(p.parent, root) for p in path.rglob("__init__.py") if "__pycache__" not in p.parts
    )
    top = collapse(edges, package)
    return {
        "folder": folder,
        "modules": len(edges),
        "top_entries": len(top),
        "top": _shape(top),
        "packages": {p: _shape(collapse(edges, p)) for p in packages},
        **_shape(edges),
        **sizes(path, root),
    }


def _print(report: dict) -> None:
    top = report["top"]
    print(
        f"{report['folder']}: {report['modules']} modules ({report['imports']} imports, {report['layers']} layers); "
        f"at the top {report['top_entries']} entries, {top['imports']} imports between them, {top['layers']} layers"
    )
    for pkg, shape in report["packages"].items():
        for c in shape["circles"]:
            print(f"  circle in {pkg}: {c}")
        for b in shape["back_up"]:
            print(f"  back up in {pkg}: {b}")
    for c in report["circles"]:
        print(f"  circle: {c}")
    for key, label in (("files_over_600", "file"), ("classes_over_400", "class")):
        for name, n in report[key]:
            print(f"  {label} over the limit: {name} ({n} lines)")
    long = report["functions_over_60"]
    print(f"  functions over {LONG_FUNCTION_LINES} lines: {len(long)}")
    for name, n, why in long:
        print(
            f"    {name} ({n} lines){'' if why else ' -- its docstring does not say why it cannot be split'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=list(PACKAGES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    reports = [measure(f) for f in args.folders]
    if args.json:
        json.dump(reports, sys.stdout, indent=2)
        print()
    else:
        for r in reports:
            _print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
