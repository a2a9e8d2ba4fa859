"""``rollout-bundle replay --engine URL``: each sample's prefill payload posted to a running SGLang
server's ``/generate``, its answer compared with ``rollout_log_probs`` (issue 38, item 5).

SGLang cannot run on these machines (it needs a GPU): the client is tested against a loopback HTTP
server that answers in SGLang's documented ``/generate`` response shape (``meta_info.
input_token_logprobs``: ``[logprob, token_id, text]`` from ``logprob_start_len`` on, the first
log-prob None) with the log-probs the test gives it, and records what it was sent. The command
that checks the client against a real SGLang serving a small Qwen2-VL on a GPU machine is in
docs/TRAINER_HOOKS.md ("replay --engine").
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

from helpers.replay import make_dump

from bundles import open_bundle
from trainer_hooks import Sample, replay_bundle
from trainer_hooks.cli import main
from trainer_hooks.replay import sglang_generate_fields

pytestmark = [pytest.mark.torch, pytest.mark.processor]


class FakeSGLang:
    """A loopback ``/generate`` that answers prefill payloads as SGLang does. ``logprobs`` maps a
    sample's tokens to its response log-probs; ``shift`` adds to one sample's; ``fail`` answers
    HTTP 500 for one. Every request body is kept in ``received``."""

    def __init__(self) -> None:
        self.logprobs: dict[tuple[int, ...], list[float]] = {}
        self.shift: dict[tuple[int, ...], float] = {}
        self.fail: set[tuple[int, ...]] = set()
        self.received: list[dict[str, Any]] = []
        self.gets: list[str] = []
        #: Bytes written as the whole HTTP answer (status line included) to every POST, when set.
        self.raw: bytes | None = None
        #: Stop listening after answering the first POST: later connections are refused.
        self.die_after_first = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.gets.append(self.path)
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.received.append(body)
                if fake.raw is not None:
                    self.wfile.write(fake.raw)
                    self.close_connection = True
                    return
                if fake.die_after_first:
                    # The listening socket closed before this answer is sent: the replay's next
                    # request is refused, deterministically.
                    fake.server.shutdown()
                    fake.server.socket.close()
                status, answer = fake.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ids = tuple(body["input_ids"])
        if path != "/generate" or ids in self.fail:
            return 500, {"error": {"message": "Internal server error"}}
        start = body["logprob_start_len"]
        response = self.logprobs[ids]
        scored = list(ids[start:])
        tail = [v + self.shift.get(ids, 0.0) for v in response]
        values = [None] + [-1.0] * (len(scored) - 1 - len(tail)) + tail
        return 200, {
            "text": "",
            "meta_info": {
                "id": "0", "prompt_tokens": len(ids), "completion_tokens": 0, "finish_reason": {"type": "length"},
                "input_token_logprobs": [[v, t, None] for v, t in zip(values, scored, strict=True)],
                "output_token_logprobs": [],
            },
        }  # fmt: skip


@pytest.fixture
def engine() -> Iterator[FakeSGLang]:
    fake = FakeSGLang()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def _teach(engine: FakeSGLang, dump: Path) -> list[Sample]:
    with open_bundle(dump) as bundle:
        samples = list(bundle.samples(Sample))
    for s in samples:
        engine.logprobs[tuple(s.tokens)] = list(s.rollout_log_probs)
    return samples


def test_the_engines_answers_fill_logprob_diff_and_the_payloads_are_sglangs(tmp_path, engine, capsys):
    dump = make_dump(tmp_path, 3)
    samples = _teach(engine, dump)
    report = tmp_path / "replay.json"
    assert main(["replay", str(dump), "--engine", engine.url, "--max-logprob-diff", "0.01",
                 "--report", str(report), "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"log-probs      3 samples, 12 tokens (engine {engine.url})" in out
    doc = json.loads(report.read_text())
    for entry, sample in zip(doc["samples"], samples, strict=True):
        diff = entry["logprob_diff"]
        assert (
            diff["mean_abs"] == 0.0
            and diff["recomputed"] == sample.rollout_log_probs
            and diff["first_over"] is None
        )
    assert doc["engine"] == {"url": engine.url, "max_logprob_diff": 0.01}
    assert len(engine.received) == 3
    fields = sglang_generate_fields()
    for body, sample in zip(engine.received, samples, strict=True):
        assert set(body) <= fields and body["input_ids"] == sample.tokens and body["return_logprob"] is True
        assert body["mm_token_expansion_start_len"] == len(sample.tokens)  # token space
        assert len(body["image_data"]) == 2 and all(
            u.startswith("data:image/png;base64,") for u in body["image_data"]
        )


def test_an_answer_over_the_threshold_or_an_http_error_names_the_sample(tmp_path, engine):
    dump = make_dump(tmp_path, 3)
    samples = _teach(engine, dump)
    engine.shift[tuple(samples[1].tokens)] = 0.5
    engine.fail.add(tuple(samples[2].tokens))
    report = replay_bundle(dump, engine=engine.url, max_logprob_diff=0.01)
    problems = {e["index"]: [p["message"] for p in e["problems"]] for e in report["samples"]}
    assert problems[10] == []
    ((over,),) = [problems[11]]
    assert (
        over.startswith("sample index 11 (position 1): the trainer's log-probs differ")
        and "mean_abs 0.5 " in over
    )
    assert "first token over it: turn 0, response token 0" in over
    ((failed,),) = [problems[12]]
    assert failed.startswith("sample index 12 (position 2): the engine answered HTTP 500")
    assert report["summary"]["problems"] == {"logprob": 2}
    assert (
        report["summary"]["logprob"]["samples"] == 2
        and report["summary"]["logprob"]["mean_abs"]["max"] == 0.5
    )


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL that refuses every connection, by construction: a TCP socket bound to a port
    but never listening holds that port for the whole test (nobody else can listen on it), and the
    kernel answers a SYN to a bound, non-listening port with a reset at once: ``ECONNREFUSED``, no
    timeout involved. (Binding port 0, closing it and hoping it stays free is a race.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_engine_that_cannot_be_reached_or_bad_usage_is_exit_2(tmp_path, capsys, refused_url):
    dump = make_dump(tmp_path, 1)
    assert main(["replay", str(dump), "--engine", refused_url, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--engine {refused_url}: cannot reach the engine" in err
    assert main(["replay", str(dump), "--engine", "127.0.0.1:30000", "--no-progress"]) == 2
    assert "--engine: expected an http:// or https:// URL" in capsys.readouterr().err
    assert main(["replay", str(dump), "--engine", "http://x", "--answers", str(dump / "none.jsonl"),
                 "--no-progress"]) == 2  # fmt: skip
    assert capsys.readouterr().err  # --answers unreadable or both: exit 2 either way


# ------------------------------------------------------------------ the client, against hostile answers


def _one_problem(report: dict) -> str:
    ((entry,),) = [report["samples"]]
    ((problem,),) = [entry["problems"]]
    assert problem["kind"] == "logprob" and entry["logprob_diff"] is None
    return problem["message"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"HTTP/1.1 302 Found\r\nLocation: /health\r\nContent-Length: 0\r\n\r\n",
         "the engine answered HTTP 302 (redirects are not followed)"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50000\r\n\r\n" + b"[" * 50000,
         "the engine's answer is not JSON: nested too deep"),
        (b"SPDY/9 banana\r\n\r\n", "the engine's answer is not HTTP: BadStatusLine"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n[1", "the engine's answer is not HTTP: IncompleteRead"),
        (b"HTTP/1.1 200 OK\r\n\r\n[" + b" " * (2 << 20) + b"]", "the engine's answer is over "),
    ],
    ids=["redirect", "deep", "bad-status-line", "incomplete", "oversized"],
)  # fmt: skip
def test_a_hostile_answer_is_a_problem_naming_the_sample_not_a_traceback(tmp_path, engine, raw, expected):
    dump = make_dump(tmp_path, 1)
    _teach(engine, dump)
    engine.raw = raw
    message = _one_problem(replay_bundle(dump, engine=engine.url))
    assert message.startswith("sample index 10 (position 0): ") and expected in message, message
    assert engine.gets == ["/health"]  # the probe only: the redirect was not followed


def test_a_proxy_in_the_environment_is_not_used(tmp_path, engine, refused_url, monkeypatch):
    """Screenshots go to the engine named, never to a proxy (and a CI with a proxy set still runs)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, refused_url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    dump = make_dump(tmp_path, 1)
    _teach(engine, dump)
    report = replay_bundle(dump, engine=engine.url)
    assert report["samples"][0]["problems"] == [] and report["samples"][0]["logprob_diff"]["mean_abs"] == 0.0


def test_an_engine_lost_mid_run_names_each_sample_and_keeps_the_report(tmp_path, engine, capsys):
    dump = make_dump(tmp_path, 3)
    _teach(engine, dump)
    engine.die_after_first = True
    report = tmp_path / "replay.json"
    assert main(["replay", str(dump), "--engine", engine.url, "--report", str(report), "--no-progress"]) == 1
    doc = json.loads(report.read_text())
    assert doc["samples"][0]["problems"] == [] and doc["samples"][0]["logprob_diff"]["mean_abs"] == 0.0
    for entry in doc["samples"][1:]:
        ((problem,),) = [entry["problems"]]
        assert problem["message"].startswith(
            f"sample index {entry['index']} (position {entry['position']}): cannot reach the engine"
        )


def test_a_slow_engine_is_cut_at_the_requests_deadline(engine):
    """An engine that sends a byte now and then never trips a per-read timeout; the request's
    deadline is over the whole exchange. Nothing here waits for a duration to pass: the trickle
    runs until the client gives up, and the generous bound only catches a client that never does."""
    import time

    from trainer_hooks.replay._engine import post_generate

    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            while not stop.wait(0.05):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        began = time.monotonic()
        with pytest.raises(ValueError, match=r"no complete answer within 0\.5 s"):
            post_generate(f"http://127.0.0.1:{server.server_address[1]}", {"input_ids": [1]}, deadline_s=0.5)
        assert time.monotonic() - began < 60
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_a_nan_from_the_engine_is_a_problem_and_the_reports_stay_strict_json(tmp_path, engine, capsys):
    dump = make_dump(tmp_path, 2)
    samples = _teach(engine, dump)
    engine.shift[tuple(samples[1].tokens)] = float("nan")  # the fake writes NaN, as Python's json does
    report = tmp_path / "replay.json"
    assert main(["replay", str(dump), "--engine", engine.url, "--report", str(report), "--json",
                 "--no-progress"]) == 1  # fmt: skip
    json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    doc = json.loads(report.read_text(), parse_constant=pytest.fail)
    ((problem,),) = [doc["samples"][1]["problems"]]
    assert problem["message"].startswith("sample index 11 (position 1): ")
    assert problem["message"].endswith(
        "the answer's log-prob of response token 0 is not a finite number: nan"
    )
