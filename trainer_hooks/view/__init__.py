"""Looking at a bundle: ``rollout-bundle view BUNDLE -o report.html``.

:func:`write_html_report` writes one self-contained HTML page for a debug dump or checkpoint
(directory or packed file): kind, meta, counts, sizes and dedup ratio, then each sample with its
status, reward, lengths and screenshots, and, given a replay report, the guard and token-check
results. See :mod:`trainer_hooks.view._report`.

What a page shows of a sample and how it is drawn is the presentation layer's,
:mod:`trainer_hooks.pages`, which ``rollout-bundle serve`` (:mod:`trainer_hooks.serve`) draws
with too, so a sample looks the same on a static page and on the server. Its pieces that were
public here stay re-exported (the same objects): a sample read down to what a page shows
(:func:`sample_view`, :class:`SampleView`, :class:`Image`), a turn's action parsed
(:func:`parse_action`, :func:`turn_action`) and drawn over its screenshot (:func:`overlay`,
:data:`OVERLAY_COLOR`), the log-prob strip (:func:`logprob_strip`), a prompt as messages
(:func:`prompt_messages`), GRPO advantages and spread (:func:`advantages`,
:func:`reward_spread`), the rule of which stored files are shown (:func:`shown_suffix`,
:data:`MAX_MEDIA_BYTES`) and the thumbnail rule (:func:`jpeg_bytes`).

The modules: ``_cli`` (the command), ``_report`` (the pages written, paged), ``_context`` (what the
report shows, as plain data), ``_media`` (each stored screenshot read once and inlined),
``_search`` (the search page and its CSP hashes); the templates ``templates/report.html.j2`` and
``search.html.j2`` (with ``search.css``, ``search.js``), found by name through
:func:`trainer_hooks.pages.environment`.
"""

from trainer_hooks.pages import (
    MAX_MEDIA_BYTES,
    OVERLAY_COLOR,
    Image,
    SampleView,
    advantages,
    jpeg_bytes,
    logprob_strip,
    overlay,
    parse_action,
    prompt_messages,
    reward_spread,
    sample_view,
    shown_suffix,
    turn_action,
)
from trainer_hooks.view._cli import register as register_commands
from trainer_hooks.view._report import ReportError, ReportWritten, load_replay_report, write_html_report

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
