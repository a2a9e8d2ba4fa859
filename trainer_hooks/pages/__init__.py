"""The presentation layer: what a page shows of a bundle's samples, and how it is drawn.

``rollout-bundle view`` (:mod:`trainer_hooks.view`, one static report) and ``rollout-bundle
serve`` (:mod:`trainer_hooks.serve`, a run in a browser) both draw with this package and with
nothing of each other, so a sample looks the same on a static page and on the server, and each
of these is changed in one place:

- how a value reads (:mod:`~trainer_hooks.pages._format`): the text bounds (:data:`MAX_TEXT`,
  :func:`text`), a status's badge and colour class (:data:`STATUS_CLASS`, :func:`badge`), the
  number formats (:func:`fmt`, :func:`num`, :func:`px`, :func:`size`, :func:`reward_text`);
- a sample read down to what a page shows (:func:`sample_view`, :class:`SampleView`; ``_samples``)
  and a turn's action parsed (:func:`parse_action`; ``_actions``);
- how it is drawn (``_graphics``): the action over its screenshot (:func:`overlay`,
  :data:`OVERLAY_COLOR`), histograms, log-prob strips (:func:`logprob_strip`), and a replay's
  recomputed log-probs against the recorded ones (:func:`mismatch_strips`);
- which stored files are shown and the thumbnail rule (``_media``: :func:`shown_suffix`,
  :func:`jpeg_bytes`);
- a sample's block (``_blocks``: :func:`sample_block`, its turns, :func:`prompt_messages`) and
  its replay verdicts (:func:`replay_block`), the key both pages sort samples by mismatch with
  (:func:`mismatch_of`) and a report's bundle-wide mismatch line (:func:`logprob_summary`);
- the one Jinja2 environment (``_jinja``: :func:`environment`, :func:`render`), reading the
  templates of this package, of ``view`` and of ``serve`` through their packages, and the one
  stylesheet (:func:`stylesheet`: ``templates/style.css`` and the overlay colours).

So a status colour is changed in :data:`STATUS_CLASS` and ``templates/style.css``, a replay
verdict's presentation in :func:`replay_block` and ``templates/sample_block.html.j2``, and both
pages follow. Everything here returns plain text, numbers and dicts, which the templates escape.
"""

from trainer_hooks.pages._actions import Action, parse_action
from trainer_hooks.pages._blocks import (
    advantages,
    draw_turn,
    link_turns,
    logprob_summary,
    mismatch_of,
    new_turn,
    prompt_messages,
    replay_block,
    reward_spread,
    sample_block,
    turn_action,
)
from trainer_hooks.pages._format import (
    MAX_TEXT,
    STATUS_CLASS,
    badge,
    chips,
    compact,
    finite,
    fmt,
    num,
    pretty,
    px,
    ratio,
    reward_text,
    short,
    size,
    text,
)
from trainer_hooks.pages._graphics import (
    OVERLAY_COLOR,
    bin_of,
    bins,
    histogram,
    logprob_strip,
    mismatch_strips,
    overlay,
)
from trainer_hooks.pages._jinja import environment, package_text, render, stylesheet
from trainer_hooks.pages._media import MAX_MEDIA_BYTES, SHOWN_SUFFIXES, jpeg_bytes, jpeg_size, shown_suffix
from trainer_hooks.pages._samples import Image, SampleView, sample_view, stored_media

__all__ = [
    "MAX_MEDIA_BYTES",
    "MAX_TEXT",
    "OVERLAY_COLOR",
    "SHOWN_SUFFIXES",
    "STATUS_CLASS",
    "Action",
    "Image",
    "SampleView",
    "advantages",
    "badge",
    "bin_of",
    "bins",
    "chips",
    "compact",
    "draw_turn",
    "environment",
    "finite",
    "fmt",
    "histogram",
    "jpeg_bytes",
    "jpeg_size",
    "link_turns",
    "logprob_strip",
    "logprob_summary",
    "mismatch_of",
    "mismatch_strips",
    "new_turn",
    "num",
    "overlay",
    "package_text",
    "parse_action",
    "pretty",
    "prompt_messages",
    "px",
    "ratio",
    "render",
    "replay_block",
    "reward_spread",
    "reward_text",
    "sample_block",
    "sample_view",
    "short",
    "shown_suffix",
    "size",
    "stored_media",
    "stylesheet",
    "text",
    "turn_action",
]
