"""The house holds the shape its docs draw (issue 37): sizes a reader can hold, no circles, no
import running back up, ``bundles`` in few rooms, one presentation for ``view`` and ``serve``,
and tests that reach into one package's privates at most.

The figures come from ``scripts/house.py`` (``python scripts/house.py`` prints them);
docs/ARCHITECTURE.md quotes them. Each rule has a planted counterexample below, so that a check
that silently stopped seeing the tree fails too.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _house():
    spec = importlib.util.spec_from_file_location("house", ROOT / "scripts" / "house.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


house = _house()
PACKAGES = ("bundles", "trainer_hooks")
#: The house may keep this many functions over 60 lines, each saying why it cannot be split.
MAX_LONG_FUNCTIONS = 10
#: ``bundles/`` seen from its top: the face and a few folders (issue 37, item 1).
MAX_BUNDLES_TOP_ENTRIES = 22
MAX_BUNDLES_TOP_LAYERS = 8


@pytest.fixture(scope="module")
def figures():
    return {p: house.measure(p) for p in PACKAGES}


def test_no_file_and_no_class_is_longer_than_a_reader_can_hold(figures):
    over = [row for f in figures.values() for key in ("files_over_600", "classes_over_400") for row in f[key]]
    assert over == []


def test_few_functions_are_long_and_each_says_why(figures):
    long = [row for f in figures.values() for row in f["functions_over_60"]]
    assert len(long) <= MAX_LONG_FUNCTIONS, long
    assert [name for name, _, why in long if not why] == []


def test_no_package_has_a_circle_or_an_import_running_back_up(figures):
    found = [
        f"{pkg}: {c}"
        for f in figures.values()
        for pkg, shape in f["packages"].items()
        for c in shape["circles"] + shape["back_up"]
    ]
    assert found == []
    assert all(f["circles"] == [] for f in figures.values())


def test_bundles_is_a_face_and_a_few_folders(figures):
    bundles = figures["bundles"]
    assert bundles["top_entries"] <= MAX_BUNDLES_TOP_ENTRIES
    assert bundles["top"]["layers"] <= MAX_BUNDLES_TOP_LAYERS


def test_the_figures_see_the_tree_and_catch_a_planted_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "_sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg._a import x\n")
    (pkg / "_a.py").write_text("from pkg._sub import y\nx = 1\n")
    (pkg / "_sub" / "__init__.py").write_text("")
    (pkg / "_sub" / "b.py").write_text("def f():\n    from pkg import _a\n")  # lazy: still an arrow
    body = "".join(f"    v{i} = {i}\n" for i in range(61))
    (pkg / "_sub" / "c.py").write_text(f"def long():\n{body}" + "\n" * 600)
    found = house.measure("pkg", tmp_path)
    assert found["modules"] == 5 and found["top_entries"] == 3
    assert found["packages"]["pkg"]["circles"] == ["pkg._a -> pkg._sub -> pkg._a"]
    assert [row[0] for row in found["functions_over_60"]] == ["pkg/_sub/c.py:1: long"]
    assert [row[0] for row in found["files_over_600"]] == ["pkg/_sub/c.py"]


# -- one presentation: view and serve share no run of lines ---------------------------------------
PRESENTATION = ("trainer_hooks/view", "trainer_hooks/serve")
SHARED_RUN = 6
_TRIVIAL = re.compile(r"^[\s\W]*$|^(import|from)\s|^#|^\{#|^<!--")


def _runs(path: Path) -> set[tuple[str, ...]]:
    lines = [" ".join(line.split()) for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if not _TRIVIAL.match(line)]
    return {tuple(lines[i : i + SHARED_RUN]) for i in range(len(lines) - SHARED_RUN + 1)}


def shared_runs(left: list[Path], right: list[Path]) -> list[str]:
    """``a ~ b`` for each pair of files, one from each side, that share a run of SHARED_RUN lines
    (blank lines, comments, imports and lone punctuation passed over, white space folded)."""
    right_runs = {p: _runs(p) for p in right}
    return [f"{a} ~ {b}" for a in left for b, runs in right_runs.items() if _runs(a) & runs]


def _presentation_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".html", ".css", ".js"))


def test_view_and_serve_share_no_run_of_lines():
    view, serve = (_presentation_files(f) for f in PRESENTATION)
    assert view and serve
    assert shared_runs(view, serve) == []


def top_level_definitions(path: Path) -> dict[str, str]:
    """Name -> the definition's code (``ast.dump``, docstrings left out) of each top-level
    function, class and assignment of one name."""
    found = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                node.body = body[1:] or [ast.Pass()]
            found[node.name] = ast.dump(node)
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            found[node.targets[0].id] = ast.dump(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found[node.target.id] = ast.dump(node.value)
    return found


def defined_twice(left: list[Path], right: list[Path]) -> list[str]:
    """Top-level definitions (a constant, a helper, a class) written the same on both sides:
    a second copy, whatever comments or docstrings say around it."""
    on_left = {
        (n, code): p for p in left if p.suffix == ".py" for n, code in top_level_definitions(p).items()
    }
    return sorted(
        f"{n}: {on_left[n, code].name} ~ {p.name}"
        for p in right
        if p.suffix == ".py"
        for n, code in top_level_definitions(p).items()
        if (n, code) in on_left
    )


def test_view_and_serve_define_nothing_twice():
    view, serve = (_presentation_files(f) for f in PRESENTATION)
    assert defined_twice(view, serve) == []


def test_the_duplicate_check_catches_a_copied_run(tmp_path):
    body = "".join(f"value_{i} = compute({i})\n" for i in range(SHARED_RUN))
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("import os\n" + body)
    b.write_text("x = 1\n\n# a comment\n" + body.replace("\n", "  \n"))
    c.write_text(body[: body.rindex("value_")])
    assert shared_runs([a], [b, c]) == [f"{a} ~ {b}"]
    (tmp_path / "d.py").write_text(
        "MAX_TEXT = 20_000  # chars\nCSP = 'a'\ndef badge(s):\n    '''One.'''\n    return {'class': s}\n"
    )
    (tmp_path / "e.py").write_text(
        "MAX_TEXT = 20_000\nCSP = 'b'\ndef badge(s):\n    '''Two.'''\n    # same code\n    return {'class': s}\n"
    )
    assert defined_twice([tmp_path / "d.py"], [tmp_path / "e.py"]) == [
        "MAX_TEXT: d.py ~ e.py",
        "badge: d.py ~ e.py",
    ]


# -- tests reach into one package's privates at most -----------------------------------------
def private_owners(path: Path) -> set[str]:
    """The packages whose private modules a file imports (``bundles._x`` -> ``bundles``)."""
    owners = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] not in PACKAGES:
                continue
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owners.add(".".join(parts[:i]))
                    break
    return owners


def mixed_private_imports(paths) -> list[str]:
    found = []
    for path in paths:
        owners = sorted(private_owners(path), key=len)
        if owners and not all(o == owners[0] or o.startswith(owners[0] + ".") for o in owners):
            found.append(f"{path.name}: {', '.join(owners)}")
    return found


def test_a_test_uses_public_names_or_the_privates_of_the_one_package_it_tests():
    paths = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "tests" / "helpers").glob("*.py"))
    assert len(paths) > 50
    assert mixed_private_imports(paths) == []


def test_the_test_import_check_catches_two_packages_privates(tmp_path):
    one = tmp_path / "test_one.py"
    one.write_text(
        "from trainer_hooks.serve import _app\nfrom trainer_hooks.serve._index import x\nimport bundles\n"
    )
    two = tmp_path / "test_two.py"
    two.write_text("import bundles._reader\nfrom trainer_hooks.view._report import y\n")
    assert mixed_private_imports([one, two]) == ["test_two.py: bundles, trainer_hooks.view"]


# -- names that say what each is ------------------------------------------------------------------
def one_letter_apart(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def look_alike_modules(root: Path) -> list[str]:
    """Pairs of modules (or subpackages) of one folder whose names, leading underscores aside,
    differ by one letter: ``_location``/``_locations``, ``cli``/``_cli``, ``_sample``/``_samples``."""
    found = []
    for folder in sorted({root, *(p.parent for p in root.rglob("__init__.py"))}):
        names = sorted(p.stem for p in folder.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
        found += [
            f"{folder.relative_to(root.parent)}: {a} ~ {b}"
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if a.lstrip("_") == b.lstrip("_") or one_letter_apart(a.lstrip("_"), b.lstrip("_"))
        ]
    return found


def test_no_two_modules_of_a_folder_differ_by_one_letter():
    assert [f for pkg in PACKAGES for f in look_alike_modules(ROOT / pkg)] == []


def test_the_look_alike_check_catches_a_pair(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name in ("__init__", "cli", "_cli", "_location", "_locations", "_codec", "_sample_codec", "_reader"):
        (pkg / f"{name}.py").write_text("")
    assert look_alike_modules(pkg) == ["pkg: _cli ~ cli", "pkg: _location ~ _locations"]
