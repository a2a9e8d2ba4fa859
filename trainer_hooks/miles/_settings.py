"""This project's settings in a stock Miles run: how they reach ``args``, and one check of them.

Stock Miles' ``parse_args`` knows none of our options (``--shared-media-dir``, ``--run-uuid``,
``--bundle-link-mode``, ... :data:`trainer_hooks.arguments.SETTINGS`): with ``--fully-async`` it
adds custom options only from its own rollout function and from
``--custom-generate-function-path`` (their ``add_arguments``), so ``train_async.py`` stops with
"unrecognized arguments" on any of ours. Two of Miles' own mechanisms reach them:

* ``--custom-config-path FILE``: Miles sets every key of that YAML on ``args`` after parsing
  (``shared_media_dir: /shared/media``). Nothing in Miles checks the keys;
* a custom generate function's ``add_arguments(parser)``, which Miles calls on its finished
  parser: ``generate.add_arguments = trainer_hooks.miles.add_arguments`` (or a call to it from
  the function's own) adds our options, and argparse checks them as usual.

:func:`check_args` is what makes the first of these safe: the plugins call it once per ``args``
object, at their first seam (construction, or the first ``log_rollout_bundle``), before anything
is read. It refuses, in one ``ValueError`` that names the config file:

* a key of that YAML that is not ours but close to one of ours (``difflib``, ratio >= 0.8:
  ``shared_media_dirr``, ``shared-media-dir``), unless Miles' own parser defines it: SGLang's
  ``sglang_model_impl`` is as close to our ``sglang_model_path``, and a Miles option in the same
  YAML is Miles' business (the dests are read from Miles' parser, built once, and only when a key
  is close). Keys far from ours are left alone: the YAML is Miles' channel for any custom
  function's settings. Where the YAML cannot be read in this process (a relative path and another
  working directory), every attribute of ``args`` is looked at the same way; without
  ``--custom-config-path`` there is nothing to misspell (argparse refuses a misspelt option);
* a value of the wrong type (``keep_rollout_checkpoints: three``), and any value the command line
  would refuse, with the command line's reason (:func:`trainer_hooks.arguments.validate_settings`,
  which also expands ``~`` in ``shared_media_dir``, makes it absolute, refuses a URL for it and
  draws ``run_uuid`` when unset). A value the YAML gave is named as its key,
  ``--custom-config-path FILE: keep_rollout_checkpoints (--keep-rollout-checkpoints): ...``: the
  user wrote the key, not the flag. Every value a message shows is bounded
  (:func:`bundles.support.bounded_repr`): a YAML alias bomb as ``run_uuid`` costs no more to
  refuse than a typo.

Trade-off: Megatron's options are not in Miles' parser as built here (Megatron adds them around
it); one within the ratio of ours given in the YAML (or, without a readable YAML, present at all)
would be refused.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import threading
from typing import Any

from bundles.support import bounded_repr
from trainer_hooks.arguments import SETTINGS, add_own_arguments, check_settings, validate_settings

__all__ = ["add_arguments", "check_args", "miles_option_names"]

SETTING_NAMES = frozenset(st.name for st in SETTINGS)
_LONGEST = max(len(name) for name in SETTING_NAMES)
#: How close (difflib's ratio) a key must be to one of ours to be taken for a misspelling of it.
CLOSE = 0.8

_CHECKED: dict[int, Any] = {}
_CHECKED_LOCK = threading.Lock()


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """This project's options, for a custom generate function's ``add_arguments`` (Miles calls it
    on its finished parser): ``generate.add_arguments = trainer_hooks.miles.add_arguments``."""
    return add_own_arguments(parser)


_miles_names: frozenset[str] | None = None


def miles_option_names() -> frozenset[str]:
    """The dests of Miles' own parser (its options and SGLang's ``--sglang-*``), or an empty set
    where Miles' parser cannot be built. Only a parser built is remembered: a process that
    imports Miles later (a test, a notebook) asks again rather than keep the empty answer."""
    global _miles_names
    if _miles_names is not None:
        return _miles_names
    try:
        from miles.utils.arguments import get_miles_extra_args_provider

        parser = argparse.ArgumentParser(add_help=False)
        # Miles' provider parses sys.argv once to find the user's functions and prints its usage
        # when that fails (it catches the exit itself).
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            get_miles_extra_args_provider()(parser)
    except (Exception, SystemExit):  # not a Miles process, or a Miles we cannot build a parser of
        return frozenset()
    _miles_names = frozenset(action.dest for action in parser._actions)
    return _miles_names


def _config_keys(path: str) -> list[str] | None:
    """The keys of Miles' ``--custom-config-path`` YAML (a path or ``base64:<payload>``), or None
    where it cannot be read here."""
    import yaml

    try:
        try:
            from miles.utils.file_arg_utils import resolve_file_arg
        except ImportError:  # not a Miles process: a plain path
            with open(path, encoding="utf-8") as f:
                text = f.read()
        else:
            text = resolve_file_arg(path)
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return [str(k) for k in data] if isinstance(data, dict) else None


def _near_misses(args: Any, keys: list[str]) -> list[tuple[str, str]]:
    """(key, our setting it is close to) for each of ``keys`` that looks like a misspelling of one
    of our settings and that Miles does not define."""
    near = []
    for key in keys:
        # A key far longer than any of ours is no misspelling of one (and difflib's cost grows
        # with the product of the lengths).
        if key in SETTING_NAMES or key.startswith("_") or len(key) > 2 * _LONGEST:
            continue
        norm = key.replace("-", "_")
        match = [norm] if norm in SETTING_NAMES else difflib.get_close_matches(norm, SETTING_NAMES, 1, CLOSE)
        if match:
            near.append((key, match[0]))
    if near:
        known = miles_option_names()
        near = [(key, match) for key, match in near if key not in known]
    return near


def check_args(args: Any) -> Any:
    """Check this project's settings on ``args`` once (see the module docstring); returns ``args``.
    Raises ``ValueError`` naming the key (and ``--custom-config-path``) or the option."""
    with _CHECKED_LOCK:
        if _CHECKED.get(id(args)) is args:
            return args
        config = getattr(args, "custom_config_path", None)
        where = f"--custom-config-path {config}" if config else "args"
        # Only a config file's keys can be misspelt (argparse refuses a misspelt option); where the
        # file cannot be read here, every attribute may have come from it.
        keys = _config_keys(str(config)) if config else []
        if keys is None:
            keys = list(vars(args))
        near = _near_misses(args, keys)
        if near:
            listed = "; ".join(
                f"{bounded_repr(key)} (did you mean {match!r}?)" for key, match in sorted(near)
            )
            raise ValueError(
                f"{where}: unknown setting {listed}; this project's settings are "
                f"{', '.join(st.name for st in SETTINGS)} (docs/INTEGRATION.md A.6)"
            )
        check_settings(vars(args), where=where)
        validate_settings(args, where=where, from_config=keys if config else ())
        _CHECKED[id(args)] = args
    return args
