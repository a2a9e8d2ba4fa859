"""The rollout engine's log-probs, asked live: :func:`score_on_engine` (``replay --engine URL``).

Each sample's prefill payload (:func:`~trainer_hooks.replay._payload.build_prefill_scoring_payload`:
``input_ids``, the images as PNG data URLs, ``return_logprob``, ``logprob_start_len``, in token
space ``mm_token_expansion_start_len``) is POSTed to the SGLang server's ``/generate`` as JSON,
one sample at a time (one payload's screenshots in memory at once); the answer's
``meta_info.input_token_logprobs`` is compared with ``rollout_log_probs`` as ``--answers`` does
(:func:`~trainer_hooks.replay._payload.compare_prefill_logprobs`), and the per-sample figures of
:mod:`trainer_hooks.replay._mismatch` are filled as ``--model`` fills them.

The client is the standard library's ``http.client``, used directly (no client dependency), so
that what reaches it is exactly the URL given: no proxy from the environment (``http_proxy`` would
otherwise receive every screenshot, even for localhost), no redirect followed (a 302 is an answer,
reported as one). Every request has one deadline over the whole exchange (:data:`DEADLINE_S`; a
timer closes the socket, so an engine that sends a byte every few minutes is cut at it, not per
read), and the answer is read up to :func:`answer_limit` bytes (a bound from the tokens asked).

Reachability is probed once, before any sample is sent (``GET /health``; any HTTP answer counts):
an engine that cannot be reached then is the caller's problem (``ValueError``: exit 2). After
that, whatever happens to one request (refused, cut, an HTTP error, not HTTP, not JSON, nested too
deep, a value that is not a finite number, an answer that does not line up with the response) is
a ``logprob`` problem naming the sample, and the replay goes on to the next one with its report.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from bundles import Bundle, BundleError
from trainer_hooks._sample import Sample
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._mismatch import sample_mismatch, threshold_problem
from trainer_hooks.replay._payload import build_prefill_scoring_payload, compare_prefill_logprobs
from trainer_hooks.replay._plan import ReplayPlan
from trainer_hooks.replay._score import NOT_SCORED

__all__ = ["DEADLINE_S", "MAX_ANSWER_BYTES", "answer_limit", "post_generate", "probe", "score_on_engine"]

#: The largest answer read from the engine, whatever the tokens asked.
MAX_ANSWER_BYTES = 64 << 20
#: One request's deadline, connection to the answer's last byte (a prefill of a long multi-image
#: sample on a busy engine takes seconds; minutes mean the engine is stuck).
DEADLINE_S = 300.0
#: The probe's deadline.
PROBE_DEADLINE_S = 30.0


def answer_limit(tokens: int) -> int:
    """The most bytes read of an answer to a payload of ``tokens`` input ids: 64 KiB plus 1 KiB a
    token (an ``input_token_logprobs`` entry ``[logprob, id, text]`` is tens of bytes), at most
    :data:`MAX_ANSWER_BYTES`."""
    return min(MAX_ANSWER_BYTES, (64 << 10) + (1 << 10) * max(int(tokens), 0))


class _Unreachable(Exception):
    """The server did not answer at all (refused, no route, no name)."""


def _exchange(
    url: str, method: str, path: str, body: bytes | None, deadline_s: float, limit: int
) -> tuple[int, bytes]:
    """One HTTP exchange with ``url``'s server: its status and at most ``limit`` + 1 bytes of body.

    Raises:
        _Unreachable: the connection could not be made.
        ValueError: cut at the deadline, or not HTTP.
    """
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=deadline_s)
    cut = threading.Event()

    def expire() -> None:  # unblocks any read or write in progress: the deadline is over it all
        cut.set()
        sock = conn.sock  # read once: the requesting thread may close it meanwhile
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    try:
        try:
            conn.connect()
        except OSError as e:
            if cut.is_set():
                raise ValueError(f"no complete answer within {deadline_s:g} s") from None
            raise _Unreachable(str(e)) from None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, parts.path.rstrip("/") + path, body=body, headers=headers)
        answer = conn.getresponse()
        raw = bytearray()
        while len(raw) <= limit and (chunk := answer.read1(min(1 << 16, limit + 1 - len(raw)))):
            raw += chunk
        if len(raw) <= limit and answer.length:  # the connection ended before Content-Length
            raise http.client.IncompleteRead(bytes(raw[-100:]), answer.length)
        if not cut.is_set():
            return answer.status, bytes(raw)
    except (OSError, http.client.HTTPException) as e:
        if not cut.is_set():
            kind = type(e).__name__
            raise ValueError(f"the engine's answer is not HTTP: {kind}: {str(e)[:200]}") from None
    finally:
        timer.cancel()
        conn.close()
    raise ValueError(f"no complete answer within {deadline_s:g} s")


def probe(url: str) -> None:
    """Raise ``ValueError`` (exit 2) naming ``url`` when its server cannot be reached at all."""
    try:
        _exchange(url, "GET", "/health", None, PROBE_DEADLINE_S, 1 << 10)
    except _Unreachable as e:
        raise ValueError(f"--engine {url}: cannot reach the engine ({e})") from None
    except ValueError as e:
        raise ValueError(f"--engine {url}: cannot reach the engine ({e})") from None


def post_generate(url: str, payload: Mapping[str, Any], deadline_s: float = DEADLINE_S) -> Any:
    """POST ``payload`` to ``<url>/generate`` and return the decoded JSON answer.

    Raises:
        ValueError: an HTTP status other than 200 (a redirect included), an answer over
            :func:`answer_limit`, not HTTP, not JSON (or nested too deep), or none within
            ``deadline_s``.
        _Unreachable: the connection could not be made.
    """
    body = json.dumps(payload, separators=(",", ":")).encode()
    limit = answer_limit(len(payload.get("input_ids") or ()))
    status, raw = _exchange(url, "POST", "/generate", body, deadline_s, limit)
    if 300 <= status < 400:
        raise ValueError(f"the engine answered HTTP {status} (redirects are not followed)")
    if status != 200:
        raise ValueError(f"the engine answered HTTP {status}: {raw[:300].decode('utf-8', 'replace')}")
    if len(raw) > limit:
        raise ValueError(
            f"the engine's answer is over {limit} bytes (the bound for {len(payload.get('input_ids') or ())} tokens)"
        )
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("the engine's answer is not JSON: nested too deep") from None
    except ValueError as e:
        raise ValueError(f"the engine's answer is not JSON: {str(e)[:200]}") from None


def score_on_engine(bundle: Bundle, plan: ReplayPlan, entries: list[dict[str, Any]], url: str) -> None:
    """Fill each entry's ``logprob_diff`` from the engine at ``url`` (see the module doc); a
    sample an earlier check refused is not sent.

    Raises:
        ValueError: the engine cannot be reached before the first sample (naming ``url``).
    """
    probe(url)
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
            entry["problems"].append(
                {"kind": "logprob", "message": f"{where}: cannot reach the engine ({e})", "image": None}
            )
            continue
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
