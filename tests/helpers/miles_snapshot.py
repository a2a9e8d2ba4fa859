"""Import a Miles checkout for tests against the real trainer.

Where Miles is looked for: ``$MILES_SOURCE`` when set (any checkout of radixark/miles: the folder
holding ``miles/`` and ``tests/``), else ``../shared/miles`` beside the project (the snapshot every
developer machine and CI has). A user's clone has neither: the tests that need Miles then skip
with one line saying so and naming ``MILES_SOURCE`` (docs/TESTING.md).

:func:`require_miles` puts the snapshot on ``sys.path`` (appended: our packages win) and installs
import stand-ins for the engine-only packages Miles imports at module level on the paths these
tests use, but never calls there:

* ``sglang``: imported at module level by ``miles.rollout.generate_utils.tool_call_utils``
  (``Tool``, ``FunctionCallParser``), ``miles.rollout.generate_hub.*`` and
  ``miles.backends.sglang_utils`` (reached from ``miles.rollout.fully_async_rollout`` and
  ``miles.rollout.data_source``). It is the inference engine itself: CUDA-only and multi-GB. The
  tests replace generation with a scripted engine, as Miles' own fully-async tests do.
* ``sglang_router``: imported at module level by
  ``miles.rollout.inference_rollout.inference_rollout_train`` (starting a router); a Rust
  extension. No test starts a router.

Each stand-in is a package whose attributes are placeholder classes that raise naming the
stand-in when called, so a code path that does need the engine fails loudly, never silently.
Two placeholders also carry the class method Miles' real ``parse_args`` calls on them to register
the engine's options (``tests/test_miles_settings.py`` runs that parser):
``sglang.srt.server_args.ServerArgs.add_cli_args`` adds three of SGLang's server options, with
SGLang's definitions: ``--dp-size`` and ``--enable-dp-attention`` (Miles' ``validate_args`` reads
them) and ``--model-impl`` (``sglang_model_impl``, as close to our ``sglang_model_path`` as a
typo: the settings check must tell it apart); ``sglang_router.launch_router.RouterArgs.add_cli_args``
adds none (Miles only forwards them to the router it would start).
Everything else Miles imports on these paths is the real package (the ``miles-tests`` extra:
httpx, pybase64, polars, aiohttp, pylatexenc, tokenizers; pytest-asyncio and pytest-timeout run
Miles' own async tests). Without a checkout, tests skip with one line.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The environment variable naming a Miles checkout (it wins over ``../shared/miles``).
MILES_SOURCE_ENV = "MILES_SOURCE"
#: The first words of the skip reason without a checkout (``.ci/test_summary.py`` groups by reason).
MISSING = f"Miles checkout not found (set {MILES_SOURCE_ENV}=/path/to/miles)"


def _miles_root() -> Path:
    given = os.environ.get(MILES_SOURCE_ENV)
    if given:
        return Path(given).expanduser().absolute()
    return (REPO / ".." / "shared" / "miles").resolve()


MILES_ROOT = _miles_root()
#: Engine-only packages replaced by import stand-ins (see the module docstring for why each).
STAND_INS = ("sglang", "sglang_router")


def _server_cli_args(parser: Any, **kwargs: Any) -> None:
    # SGLang's own definitions (sglang/srt/server_args.py) of the three options; see the docstring.
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--enable-dp-attention", action="store_true")
    parser.add_argument("--model-impl", type=str, default="auto")


def _router_cli_args(parser: Any, **kwargs: Any) -> None:
    pass


# Class methods Miles' parse_args calls on a stand-in (see the module docstring).
_CLASS_METHODS: dict[tuple[str, str], dict[str, Any]] = {
    ("sglang.srt.server_args", "ServerArgs"): {"add_cli_args": staticmethod(_server_cli_args)},
    ("sglang_router.launch_router", "RouterArgs"): {"add_cli_args": staticmethod(_router_cli_args)},
}


def _placeholder(module: str, name: str) -> type:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{module}.{name} is an import stand-in (tests/helpers/miles_snapshot.py): this code path needs "
            "the real engine"
        )

    return type(
        name,
        (),
        {
            "__module__": module,
            "__new__": refuse,
            "__init_subclass__": classmethod(lambda c: None),
            **_CLASS_METHODS.get((module, name), {}),
        },
    )


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, "import stand-in (tests/helpers/miles_snapshot.py)")
        module.__path__ = []

        def __getattr__(attr: str, _module: str = spec.name) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            value = _placeholder(_module, attr)
            setattr(module, attr, value)
            return value

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_stand_ins() -> None:
    """Install the stand-ins (idempotent) for packages that are not really installed."""
    if not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        missing = [n for n in STAND_INS if importlib.util.find_spec(n) is None]
        if missing:
            sys.meta_path.append(_StandInFinder())


def miles_missing() -> str | None:
    """Why the snapshot cannot be used here, or None."""
    if (MILES_ROOT / "miles" / "utils" / "types.py").is_file():
        return None
    if os.environ.get(MILES_SOURCE_ENV):
        return f"{MISSING}: {MILES_SOURCE_ENV}={os.environ[MILES_SOURCE_ENV]} has no miles/utils/types.py"
    return f"{MISSING}: no {MILES_SOURCE_ENV}, and no checkout at {MILES_ROOT}"


def add_miles_to_path() -> Path:
    if str(MILES_ROOT) not in sys.path:
        sys.path.append(str(MILES_ROOT))
    install_stand_ins()
    return MILES_ROOT


def require_miles() -> Path:
    """Skip the calling test module (one line) without the snapshot or its light dependencies;
    else make ``miles`` importable and return the snapshot's root."""
    reason = miles_missing()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    add_miles_to_path()
    for dep in ("httpx", "pybase64", "aiohttp", "pylatexenc", "torch"):
        if importlib.util.find_spec(dep) is None:
            pytest.skip(f"Miles tests need {dep} (pip install -e '.[miles-tests]')", allow_module_level=True)
    return MILES_ROOT
