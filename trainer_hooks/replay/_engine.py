"""The rollout engine's log-probs, asked live: :func:`score_on_engine` (``replay --engine URL``).

Each sample's prefill payload (:func:`~trainer_hooks.replay._payload.build_prefill_scoring_payload`:
``input_ids``, the images as PNG data URLs, ``return_logprob``, ``logprob_start_len``, in token
space ``mm_token_expansion_start_len``) is POSTed to the SGLang server's ``/generate`` as JSON,
one sample at a time (one payload's screenshots in memory at once); the answer's
``meta_info.input_token_logprobs`` is compared with ``rollout_log_probs`` as ``--answers`` does
(:func:`~trainer_hooks.replay._payload.compare_prefill_logprobs`), and the per-sample figures of
:mod:`trainer_hooks.replay._mismatch` are filled as ``--model`` fills them.

Only the standard library speaks HTTP here (``urllib``): no client dependency. A server that
cannot be reached at all is the caller's problem (``ValueError``: exit 2), before any sample is
judged; an answer that is an HTTP error, not JSON, or does not line up with the response is a
``logprob`` problem naming the sample.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from bundles import Bundle, BundleError
from trainer_hooks._sample import Sample
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._mismatch import sample_mismatch, threshold_problem
from trainer_hooks.replay._payload import build_prefill_scoring_payload, compare_prefill_logprobs
from trainer_hooks.replay._plan import ReplayPlan
from trainer_hooks.replay._score import NOT_SCORED

__all__ = ["MAX_ANSWER_BYTES", "post_generate", "score_on_engine"]

#: The largest answer read from the engine (a prefill answer is a few hundred bytes a token).
MAX_ANSWER_BYTES = 64 << 20


class _Unreachable(Exception):
    """The server did not answer at all (refused, timed out, not HTTP)."""


def post_generate(url: str, payload: Mapping[str, Any], timeout: float = 300.0) -> Any:
    """POST ``payload`` to ``<url>/generate`` and return the decoded JSON answer.

    Raises:
        ValueError: an HTTP error status, an answer over :data:`MAX_ANSWER_BYTES`, or not JSON.
        _Unreachable: no HTTP answer at all.
    """
    body = json.dumps(payload, separators=(",", ":")).encode()
    request = urllib.request.Request(
        url.rstrip("/") + "/generate", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw = answer.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as e:
        detail = e.read(300).decode("utf-8", "replace")
        raise ValueError(f"the engine answered HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise _Unreachable(str(getattr(e, "reason", e))) from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise ValueError(f"the engine's answer is over {MAX_ANSWER_BYTES} bytes")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ValueError(f"the engine's answer is not JSON: {str(e)[:200]}") from None


def score_on_engine(bundle: Bundle, plan: ReplayPlan, entries: list[dict[str, Any]], url: str) -> None:
    """Fill each entry's ``logprob_diff`` from the engine at ``url`` (see the module doc); a
    sample an earlier check refused is not sent.

    Raises:
        ValueError: the engine cannot be reached (naming ``url``).
    """
    media = MediaReader(bundle, allow_outside=plan.allow_outside_media)
    args = plan.args()
    todo = [e for e in entries if not any(p["kind"] in NOT_SCORED for p in e["problems"])]
    positions = [e["position"] for e in todo]
    for entry, sample in zip(todo, bundle.samples(Sample, indices=positions), strict=True):
        where = f"sample index {entry['index']} (position {entry['position']})"
        try:
            payload = build_prefill_scoring_payload(args, sample, {}, media=media)
            answer = post_generate(url, payload)
            basic = compare_prefill_logprobs(sample, answer)
        except _Unreachable as e:
            raise ValueError(f"--engine {url}: cannot reach the engine ({e})") from None
        except (OSError, ValueError, BundleError) as e:
            entry["problems"].append({"kind": "logprob", "message": f"{where}: {e}", "image": None})
            continue
        n = sample.response_length
        entry["logprob_diff"] = sample_mismatch(
            basic["recomputed"], sample.rollout_log_probs, sample.tokens[len(sample.tokens) - n :],
            sample.loss_mask, plan.max_logprob_diff, plan.tis_cap,
        )  # fmt: skip
        if (problem := threshold_problem(where, entry["logprob_diff"], plan.max_logprob_diff)) is not None:
            entry["problems"].append(problem)
