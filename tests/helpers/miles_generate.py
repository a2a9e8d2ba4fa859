"""A custom generate function for Miles' ``--custom-generate-function-path`` whose ``add_arguments``
is :func:`trainer_hooks.miles.add_arguments`: what a stock run with a generate function of its own
does to get this project's options on the command line (tests/test_miles_settings.py parses with
it; nothing generates)."""

from __future__ import annotations

from typing import Any

from trainer_hooks.miles import add_arguments


async def generate(args: Any, sample: Any, sampling_params: Any) -> Any:
    raise NotImplementedError("tests/helpers/miles_generate.py only adds options; it never generates")


generate.add_arguments = add_arguments  # type: ignore[attr-defined]
