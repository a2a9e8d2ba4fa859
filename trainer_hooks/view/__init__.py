"""Looking at a bundle: ``rollout-bundle view BUNDLE -o report.html``.

:func:`write_html_report` writes one self-contained HTML page for a debug dump or checkpoint
(directory or packed file): kind, meta, counts, sizes and dedup ratio, then each sample with its
status, reward, lengths and screenshots, and, given a replay report, the guard and token-check
results. See :mod:`trainer_hooks.view._report`.

The pieces a live page needs too are public here, so that ``rollout-bundle serve``
(:mod:`trainer_hooks.serve`) draws what ``view`` draws rather than a second copy: a sample read
down to what a page shows (:func:`sample_view`), a turn's action parsed (:func:`parse_action`)
and drawn over its screenshot (:func:`overlay`), the log-prob strip (:func:`logprob_strip`), a
prompt as messages (:func:`prompt_messages`), a sample's view rebuilt from its fields (:class:`SampleView`, :class:`Image`), GRPO advantages (:func:`advantages`) and the rule
of which stored files are shown (:func:`shown_suffix`). The templates themselves
(``trainer_hooks/view/templates``) are loaded by package name.
"""

from trainer_hooks.view._actions import parse_action
from trainer_hooks.view._cli import register as register_commands
from trainer_hooks.view._context import advantages, prompt_messages, reward_spread, turn_action
from trainer_hooks.view._graphics import OVERLAY_COLOR, logprob_strip, overlay
from trainer_hooks.view._media import MAX_MEDIA_BYTES, jpeg_bytes, shown_suffix
from trainer_hooks.view._report import ReportError, ReportWritten, load_replay_report, write_html_report
from trainer_hooks.view._samples import Image, SampleView, sample_view

__all__ = [
    "MAX_MEDIA_BYTES",
    "OVERLAY_COLOR",
    "Image",
    "ReportError",
    "ReportWritten",
    "SampleView",
    "advantages",
    "jpeg_bytes",
    "load_replay_report",
    "logprob_strip",
    "overlay",
    "parse_action",
    "prompt_messages",
    "register_commands",
    "reward_spread",
    "sample_view",
    "shown_suffix",
    "turn_action",
    "write_html_report",
]
