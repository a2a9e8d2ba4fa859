"""The walls between packages: nothing imports another package's private module.

A package's ``_private`` modules (any dotted part starting with one underscore) are for the
package itself and its subpackages. Everyone else goes through the package's ``__init__``,
its public surface: whoever changes a private module can then know what breaks by reading one
package. ``trainer_hooks`` is a client of ``bundles``' public API only, and ``bundles`` never
imports ``trainer_hooks``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Code held to the rule: the two packages, and what a user reads as examples of their use.
CHECKED = ("bundles", "trainer_hooks", "examples", "benchmarks", "scripts")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported(tree: ast.AST):
    """(line, dotted module path) for every absolute import, names that are modules included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                if _is_module(f"{node.module}.{alias.name}"):
                    yield node.lineno, f"{node.module}.{alias.name}"


def private_import_violations(files) -> list[str]:
    found = []
    for path in files:
        importer = _module_name(path)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for line, dotted in _imported(ast.parse(path.read_text(), str(path))):
            parts = dotted.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if owner and not (package == owner or package.startswith(owner + ".")):
                        found.append(f"{path.relative_to(ROOT)}:{line}: imports {dotted}, private to {owner}")
                    break
    return found


def _files():
    return sorted(p for top in CHECKED if (ROOT / top).is_dir() for p in (ROOT / top).rglob("*.py"))


def test_no_module_imports_another_packages_private_module():
    files = _files()
    assert len(files) > 40  # the scan sees the tree
    violations = private_import_violations(files)
    assert not violations, "private imports across package walls:\n" + "\n".join(violations)


def test_bundles_never_imports_trainer_hooks():
    offenders = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in sorted((ROOT / "bundles").rglob("*.py"))
        for line, dotted in _imported(ast.parse(p.read_text()))
        if dotted == "trainer_hooks" or dotted.startswith("trainer_hooks.")
    ]
    assert not offenders


def test_the_check_catches_a_private_import(tmp_path, monkeypatch):
    # The rule itself: a cross-package private import is found, one inside the package is not.
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    for pkg in ("a", "a/sub", "b"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "a" / "_core.py").write_text("")
    (tmp_path / "a" / "sub" / "_inner.py").write_text("from a._core import x\nfrom a import _core\n")
    (tmp_path / "b" / "user.py").write_text("import a._core\nfrom a.sub import _inner\nfrom a import _name\n")
    found = private_import_violations([tmp_path / "a" / "sub" / "_inner.py", tmp_path / "b" / "user.py"])
    assert found == [
        "b/user.py:1: imports a._core, private to a",
        "b/user.py:2: imports a.sub._inner, private to a.sub",
    ]


@pytest.mark.parametrize(
    "package", ["run_media", "checkpoints", "journal", "rollout", "dumps", "arguments", "replay", "view"]
)
def test_each_trainer_hooks_subpackage_declares_its_surface(package):
    import importlib

    module = importlib.import_module(f"trainer_hooks.{package}")
    assert module.__doc__ and module.__doc__.strip()
    assert all(hasattr(module, name) for name in module.__all__)


# -- the seams inside bundles: the format, the local half, the store half, one folder each ----------
#: Each folder of bundles and the folders it may import: the format neither half, the dataset
#: conversion (``_dataset``, which ``Bundle.to_arrow`` delegates to) the format only, the local half
#: the format and the dataset conversion, the store half the format and the local half. Above them the face (``__init__``, ``support``, ``cli``,
#: ``_api``, ``_commands``) may import any of them.
FOLDERS = {
    "bundles._format": set(),
    "bundles._dataset": {"bundles._format"},
    "bundles._local": {"bundles._format", "bundles._dataset"},
    "bundles._store": {"bundles._format", "bundles._local"},
}
#: What the folders may import at the top of bundles: only what lies below all three.
BELOW_THE_FOLDERS = {"bundles", "bundles._errors", "bundles._urls", "bundles._version"}


def _in(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def _bundles_graph() -> dict[str, set[str]]:
    """Module -> the bundles modules it imports, every import counted (inside functions too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "bundles").rglob("*.py")):
        name = _module_name(path)
        graph[name] = {
            dotted
            for _, dotted in _imported(ast.parse(path.read_text(), str(path)))
            if dotted.startswith("bundles")
        }
    return graph


def test_the_local_half_of_bundles_never_imports_the_store_half():
    graph = _bundles_graph()
    assert all(any(_in(m, folder) for m in graph) for folder in FOLDERS)  # the folders are there
    found = [
        f"{module} imports {dotted}"
        for module, deps in graph.items()
        for folder, allowed in FOLDERS.items()
        if _in(module, folder)
        for dotted in deps
        if not _in(dotted, folder)
        and not any(_in(dotted, other) for other in allowed)
        and (dotted in BELOW_THE_FOLDERS) is False
    ]
    assert found == [], (
        "the format imports neither half, the local half never the store half, and no folder the "
        "face above it:\n" + "\n".join(found)
    )


# The questions "which kind of location is this?" that trainer_hooks may ask: only while it
# validates its arguments. Elsewhere it holds a bundles.Location (chosen once, by
# Location.of) and calls it; where it must adapt it reads a capability (``uploads``,
# ``has_pool``, ...), never the kind (issue 26, item 2; issue 31, item 5).
#: Names whose mere use is a question about the kind of a location (or a way to answer one).
LOCATION_QUESTIONS = {
    "is_store_url",
    "classify",
    "url_scheme",
    "StorePrefix",
    "journal_prefix",
    "PACK_SUFFIX",
    "STORE_SCHEMES",
}
#: Attributes that are kind flags of a source or location.
KIND_FLAGS = {"packed", "is_remote", "is_packed"}  # not "remote": Ray's actor.method.remote()
#: Text that, compared against a location, asks for its kind: a scheme or the packed suffix.
_KIND_TEXT = ("://", ".rbundle")
MAY_ASK = ("trainer_hooks/arguments/",)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _annotations(tree: ast.AST) -> set[int]:
    """The nodes inside annotations (cached per tree)."""
    cached = getattr(tree, "_annotation_ids", None)
    if cached is None:
        roots: list[ast.AST] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                roots.append(node.annotation)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                roots.append(node.returns)
            elif isinstance(node, ast.AnnAssign):
                roots.append(node.annotation)
        cached = {id(n) for r in roots for n in ast.walk(r)}
        tree._annotation_ids = cached  # type: ignore[attr-defined]
    return cached


def location_questions(files) -> list[str]:
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(MAY_ASK):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if id(node) in _annotations(tree):
                continue  # naming a type is not asking a location for its kind
            if isinstance(node, ast.Name) and node.id in LOCATION_QUESTIONS:
                found.append(f"{rel}:{node.lineno}: {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr in LOCATION_QUESTIONS | KIND_FLAGS:
                found.append(f"{rel}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value == ".rbundle":
                found.append(f"{rel}:{node.lineno}: '.rbundle'")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
                and any(
                    isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and any(t in a.value for t in _KIND_TEXT)
                    for a in node.args
                )
            ):
                found.append(f"{rel}:{node.lineno}: {node.func.attr}({ast.unparse(node.args[0])})")
    return sorted(set(found))


def test_trainer_hooks_never_asks_what_kind_of_location_it_has():
    files = sorted((ROOT / "trainer_hooks").rglob("*.py"))
    assert location_questions(files) == []


PLANTED_ASKS = {
    "if bundles.is_store_url(p):\n    pass\n": ".is_store_url",
    "p = bundles.StorePrefix(url)\n": ".StorePrefix",
    "x = journal_prefix(root)\n": "journal_prefix",
    "ok = str(dest).endswith(PACK_SUFFIX)\n": "PACK_SUFFIX",
    "ok = dest.endswith('.rbundle')\n": "'.rbundle'",
    "ok = str(dest).startswith('s3://')\n": "startswith('s3://')",
    "ok = bundle.source.packed\n": ".packed",
    "k = bundles.url_scheme(u)\n": ".url_scheme",
}


@pytest.mark.parametrize("code", sorted(PLANTED_ASKS))
def test_the_location_check_catches_a_question(tmp_path, monkeypatch, code):
    bad = tmp_path / "trainer_hooks" / "dumps" / "_x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text('"""A docstring may say .rbundle and s3:// freely."""\nimport bundles\n' + code)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = location_questions([bad])
    assert found and all(f.startswith("trainer_hooks/dumps/_x.py:3: ") for f in found), found
    assert any(f.endswith(PLANTED_ASKS[code]) for f in found), found


def test_the_location_check_leaves_prose_and_arguments_alone(tmp_path, monkeypatch):
    ok = tmp_path / "trainer_hooks" / "dumps" / "_y.py"
    ok.parent.mkdir(parents=True)
    ok.write_text(
        '"""Ends in .rbundle; s3:// too."""\nHELP = "a packed file ending in .rbundle"\n'
        "def f(p: StorePrefix) -> PACK_SUFFIX:\n    x: StorePrefix = p\n"
    )
    arg = tmp_path / "trainer_hooks" / "arguments" / "_z.py"
    arg.parent.mkdir(parents=True)
    arg.write_text("from bundles import is_store_url\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert location_questions([ok, arg]) == []


# -- public surfaces hold what users call -----------------------------------------------------
def private_names_in_all(paths: list[Path]) -> list[str]:
    """``file:line: name`` for each ``_``-name (dunders aside) listed in a literal ``__all__``."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if not isinstance(node, ast.Assign | ast.AugAssign):
                continue
            if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
            for item in ast.walk(node.value):
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    name = item.value
                    if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                        found.append(f"{path.name}:{item.lineno}: {name}")
    return found


def test_no_private_name_is_exported():
    paths = [p for pkg in ("bundles", "trainer_hooks") for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert private_names_in_all(paths) == []


def test_the_private_export_check_catches_a_planted_one(tmp_path):
    planted = tmp_path / "face.py"
    planted.write_text('__all__ = ["public", "__version__"]\n__all__ += ["_internal"]\n')
    assert private_names_in_all([planted]) == ["face.py:2: _internal"]


# -- rooms a reader can hold in mind ---------------------------------------------------------
MAX_FUNCTION_LINES = 80


def long_functions(files) -> list[str]:
    """Functions longer than MAX_FUNCTION_LINES (def to end, docstring included) whose docstring
    does not say why they cannot be split (issue 31, item 6)."""
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and "cannot be split" not in (ast.get_docstring(node) or ""):
                    found.append(
                        f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: {node.name} ({lines} lines)"
                    )
    return found


def test_no_function_is_longer_than_a_reader_can_hold():
    files = sorted((ROOT / "bundles").rglob("*.py")) + sorted((ROOT / "trainer_hooks").rglob("*.py"))
    assert long_functions(files) == []


def test_the_length_check_catches_a_long_function_and_honours_a_reason(tmp_path, monkeypatch):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    long = tmp_path / "trainer_hooks" / "_long.py"
    long.parent.mkdir(parents=True)
    long.write_text(f"def f():\n{body}\n\ndef g():\n    '''One table; cannot be split.'''\n{body}")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert long_functions([long]) == [f"trainer_hooks/_long.py:1: f ({MAX_FUNCTION_LINES + 1} lines)"]
