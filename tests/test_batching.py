"""Continuous batching in the server: exactness alone vs in a batch, admission control, timeouts,
faults (a failing request, slow readers, disconnects) and shutdown while streaming."""

from __future__ import annotations

import json
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from live_server import LiveServer
from nexttok.generation.loop import Generation
from nexttok.models.slot_cache import SlotCache
from nexttok.server import ServerLimits, create_app, load_served

MODEL = "tiny"
NO_EOS = {"logit_bias": {"50256": -100}}  # long generations must not end early by sampling EOS
NEAR_TIE = 1e-3  # a top-two logprob gap smaller than this is a near tie


def _server(chat_model_dir, dtype=None, **limits):
    served = load_served(str(chat_model_dir), MODEL, dtype=dtype)
    return LiveServer(create_app([served], limits=ServerLimits(**limits)))


def _complete(url, **body):
    response = httpx.post(url + "/v1/completions", json={"model": MODEL, **body}, timeout=120)
    return response


def _metrics(url) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


def _stream_events(url, body, pause: float = 0.0) -> list:
    events = []
    with httpx.stream("POST", url + "/v1/completions", json={"model": MODEL, "stream": True, **body},
                      timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                time.sleep(pause)
    return events


REQUESTS = [{"prompt": f"Request number {i} says", "max_tokens": 24,
             **({"temperature": 0} if i % 2 else {"temperature": 1.1, "top_p": 0.9, "seed": 100 + i})}
            for i in range(8)]


@pytest.mark.parametrize("dtype", [None, "int4", "int8"])
def test_same_tokens_alone_and_in_a_batch_of_8(chat_model_dir, dtype):
    """Float weights: every decode step runs 8 rows (BLAS picks kernels by row count). Quantized:
    the kernels are row-independent, so only the running rows run, and still nothing differs."""
    with _server(chat_model_dir, dtype, max_running=8) as live:
        assert live.server.app.state.models[MODEL].scheduler.pad_to == (8 if dtype is None else 1)
        alone = [_complete(live.url, **body).json()["choices"][0]["text"] for body in REQUESTS]
        before = _metrics(live.url)
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda b: _complete(live.url, **b).json()["choices"][0]["text"], REQUESTS))
        after = _metrics(live.url)
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert a == b, f"request {i} ({REQUESTS[i]}): alone {a!r} vs batched {b!r}"
    tokens = after["nexttok_tokens_generated_total"] - before["nexttok_tokens_generated_total"]
    steps = after["nexttok_decode_steps_total"] - before["nexttok_decode_steps_total"]
    assert tokens == 8 * 24
    assert tokens / steps > 2  # requests really shared decode steps


STAGE_FIELDS = [  # llama-server's fields for the other stages, each request its own mix
    {"dry_multiplier": 0.8, "dry_allowed_length": 1, "top_n_sigma": 2.0, "repeat_last_n": 8, "presence_penalty": 0.4},
    {"xtc_probability": 0.6, "xtc_threshold": 0.05, "typical_p": 0.9, "dynatemp_range": 0.5},
    {"mirostat": 2, "mirostat_tau": 3.0, "temperature": 0.9},
    {"mirostat": 1, "mirostat_eta": 0.3, "dry_multiplier": 1.0},
]
STAGE_REQUESTS = [{"prompt": f"Request number {i} says", "max_tokens": 24, "seed": 200 + i, **NO_EOS,
                   **STAGE_FIELDS[i % 4]} for i in range(8)]


def test_every_stage_same_tokens_alone_and_in_a_batch_of_8(chat_model_dir):
    """DRY's history, XTC's chances and Mirostat's mu belong to each request's own chain: a request
    samples the same tokens alone as among seven others."""
    with _server(chat_model_dir, max_running=8) as live:
        alone = [_complete(live.url, **body).json()["choices"][0]["text"] for body in STAGE_REQUESTS]
        before = _metrics(live.url)
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda b: _complete(live.url, **b).json()["choices"][0]["text"], STAGE_REQUESTS))
        after = _metrics(live.url)
    steps = after["nexttok_decode_steps_total"] - before["nexttok_decode_steps_total"]
    assert all(alone) and 8 * 24 / steps > 2  # the requests really shared decode steps
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert a == b, f"request {i} ({STAGE_REQUESTS[i]}): alone {a!r} vs batched {b!r}"


def _steps_before_a_near_tie(choice: dict) -> int:
    """Steps of a greedy choice (2 alternatives per token) before the first whose top two
    logprobs are within NEAR_TIE: there float rounding may rightly pick the other one."""
    tops = choice["logprobs"]["top_logprobs"]
    for i, top in enumerate(tops):
        best = sorted(top.values(), reverse=True)
        if len(best) < 2 or best[0] - best[1] < NEAR_TIE:
            return i
    return len(tops)


def test_without_batch_invariance_decode_runs_only_the_running_rows(chat_model_dir, monkeypatch):
    """batch_invariant=False: no scratch rows, so a batch's rows are the running requests and no
    more; the answers stay right: greedy tokens as alone up to the first near tie (where a batch's
    float rounding may pick the other token), logprobs equal up to float rounding."""
    batches = []  # (rows in the decode step, requests running)
    original = SlotCache.running_view

    def running_view(self, pad_to=1):
        view = original(self, pad_to)
        batches.append((view.n, self.running))
        return view

    monkeypatch.setattr(SlotCache, "running_view", running_view)
    # Prompts whose greedy runs on the test model have no near tie early on (asserted below).
    requests = [{"prompt": f"Request number {i} says", "max_tokens": 24, "temperature": 0, "logprobs": 2}
                for i in (1, 3, 5, 7)]
    with _server(chat_model_dir, max_running=4, batch_invariant=False) as live:
        alone = [_complete(live.url, **body).json() for body in requests]
        assert batches and all(n == running == 1 for n, running in batches)  # alone: one row, not 4
        batches.clear()
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda b: _complete(live.url, **b).json(), requests))
    assert all(n == running for n, running in batches), batches
    assert max(n for n, _ in batches) > 1  # requests really shared decode steps
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert b["usage"]["completion_tokens"] == 24 and b["choices"][0]["finish_reason"] == "length"
        a, b = a["choices"][0], b["choices"][0]
        sure = _steps_before_a_near_tie(a)
        assert sure >= 20, f"request {i}: a near tie at step {sure}; the test needs prompts without early ties"
        assert b["logprobs"]["tokens"][:sure] == a["logprobs"]["tokens"][:sure]
        assert b["logprobs"]["token_logprobs"][:sure] == pytest.approx(a["logprobs"]["token_logprobs"][:sure],
                                                                       abs=1e-4)
        if sure == 24:  # no near tie: the very same completion
            assert b["text"] == a["text"] and b["logprobs"]["tokens"] == a["logprobs"]["tokens"]


def test_n_choices_decode_together(chat_model_dir):
    with _server(chat_model_dir, max_running=4) as live:
        before = _metrics(live.url)
        result = _complete(live.url, prompt="Hi", max_tokens=16, n=4, seed=9, temperature=1.0).json()
        after = _metrics(live.url)
    assert [c["index"] for c in result["choices"]] == [0, 1, 2, 3]
    steps = after["nexttok_decode_steps_total"] - before["nexttok_decode_steps_total"]
    assert steps < 4 * 15


def test_full_queue_gets_429_with_retry_after_and_ollamas_503(chat_model_dir):
    with _server(chat_model_dir, max_running=1, max_queue=1) as live:
        long = {"prompt": "Long", "max_tokens": 3000, "temperature": 1.0, **NO_EOS}
        blockers = [threading.Thread(target=_stream_events, args=(live.url, long)) for _ in range(2)]
        for thread, (gauge, value) in zip(blockers, [("running", 1), ("queue_depth", 1)], strict=True):
            thread.start()  # one at a time: the second must find the first already running
            deadline = time.monotonic() + 10
            while _metrics(live.url)[f"nexttok_{gauge}"] < value:
                assert time.monotonic() < deadline, _metrics(live.url)
                time.sleep(0.02)
        response = _complete(live.url, prompt="x", max_tokens=2)
        assert response.status_code == 429, response.text
        assert response.headers["Retry-After"] == "1"
        assert response.json()["error"]["code"] == "queue_full"
        ollama = httpx.post(live.url + "/api/generate", json={"model": MODEL, "prompt": "x", "raw": True})
        assert ollama.status_code == 503 and ollama.headers["Retry-After"] == "1"  # Ollama's status for it
        assert list(ollama.json()) == ["error"] and "server busy" in ollama.json()["error"]
        assert _metrics(live.url)["nexttok_rejected_total"] == 2
        live.stop()
        for thread in blockers:
            thread.join(timeout=30)
            assert not thread.is_alive()


def test_request_timeout(chat_model_dir):
    with _server(chat_model_dir, request_timeout=0.3) as live:
        response = _complete(live.url, prompt="Slow", max_tokens=3000, temperature=1.0, **NO_EOS)
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        events = _stream_events(live.url, {"prompt": "Slow", "max_tokens": 3000, "temperature": 1.0, **NO_EOS})
        assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "timeout_error"
        assert _metrics(live.url)["nexttok_timeouts_total"] == 2
        assert _complete(live.url, prompt="quick", max_tokens=3).status_code == 200  # still serving


def test_a_failing_request_leaves_the_others_alone(chat_model_dir, monkeypatch, caplog):
    """...and the server's log keeps each failure with its traceback (the client sees one line)."""
    original = Generation.sample

    def sample(self, logits, elapsed, prefill):
        if "poison" in self.tokenizer.decode(self.prompt_ids) and len(self.tokens) == 3:
            raise RuntimeError("injected failure")
        return original(self, logits, elapsed, prefill)

    monkeypatch.setattr(Generation, "sample", sample)
    with _server(chat_model_dir) as live:
        expected = _complete(live.url, prompt="healthy", max_tokens=20, temperature=0).json()["choices"][0]["text"]
        with ThreadPoolExecutor(4) as pool:
            poisoned = pool.submit(_complete, live.url, prompt="poison", max_tokens=20, temperature=0)
            poisoned_stream = pool.submit(_stream_events, live.url, {"prompt": "poison pill", "max_tokens": 20})
            healthy = [pool.submit(_complete, live.url, prompt="healthy", max_tokens=20, temperature=0)
                       for _ in range(2)]
        assert poisoned.result().status_code == 500
        assert poisoned.result().json()["error"]["code"] == "generation_failed"
        events = poisoned_stream.result()
        assert events[-1] == "[DONE]" and "injected failure" in events[-2]["error"]["message"]
        assert [h.result().json()["choices"][0]["text"] for h in healthy] == [expected, expected]
        assert _metrics(live.url)["nexttok_failed_total"] == 2
    failures = [r for r in caplog.records if r.name == "nexttok.server" and "generation failed" in r.getMessage()]
    assert len(failures) == 2 and all("injected failure" in r.getMessage() for r in failures)
    assert all(r.exc_info and "in sample" in "".join(traceback.format_exception(*r.exc_info)) for r in failures)


def test_slow_reader_does_not_hold_up_others(chat_model_dir):
    with _server(chat_model_dir) as live:
        slow = threading.Thread(target=_stream_events,
                                args=(live.url, {"prompt": "slow", "max_tokens": 40}, 0.1))
        slow.start()
        start = time.monotonic()
        fast = _stream_events(live.url, {"prompt": "fast", "max_tokens": 40, "temperature": 0})
        assert fast[-1] == "[DONE]" and fast[-2]["choices"][0]["finish_reason"] == "length"
        assert slow.is_alive()  # the slow reader is still reading while the fast one is done
        assert time.monotonic() - start < 4
        slow.join(timeout=30)


def test_disconnects_free_slots(chat_model_dir):
    with _server(chat_model_dir, max_running=2) as live:
        body = {"model": MODEL, "prompt": "Go", "max_tokens": 3000, "stream": True, "temperature": 1.0, **NO_EOS}
        for _ in range(3):  # three times more than the slots: each disconnect must free its slot
            with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as response:
                lines = response.iter_lines()
                [next(lines) for _ in range(4)]
        deadline = time.monotonic() + 10
        while _metrics(live.url)["nexttok_cancelled_total"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _metrics(live.url)["nexttok_running"] == 0
        assert _complete(live.url, prompt="after", max_tokens=3).status_code == 200


def test_shutdown_while_streaming_ends_streams_cleanly(chat_model_dir):
    live = _server(chat_model_dir).__enter__()
    events: list = []
    reader = threading.Thread(target=lambda: events.extend(
        _stream_events(live.url, {"prompt": "Forever", "max_tokens": 3000, "temperature": 1.0, **NO_EOS})))
    reader.start()
    deadline = time.monotonic() + 10
    while _metrics(live.url)["nexttok_running"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    start = time.monotonic()
    live.stop()
    reader.join(timeout=30)
    assert not reader.is_alive() and not live.thread.is_alive()
    assert time.monotonic() - start < 15
    assert events[-1] == "[DONE]" and "shutting down" in events[-2]["error"]["message"]


def test_metrics_format(chat_model_dir):
    with _server(chat_model_dir) as live:
        _complete(live.url, prompt="m", max_tokens=4)
        text = httpx.get(live.url + "/metrics").text
    for name in ("nexttok_queue_depth", "nexttok_running", "nexttok_tokens_generated_total",
                 'nexttok_time_to_first_token_seconds_bucket{le="+Inf"} 1',
                 "nexttok_time_per_output_token_seconds_count 3", "# TYPE nexttok_time_to_first_token_seconds histogram"):
        assert name in text


def test_bad_limits():
    with pytest.raises(ValueError, match="max_running must be an integer >= 1"):
        ServerLimits(max_running=0)
    with pytest.raises(ValueError, match="request_timeout must be > 0"):
        ServerLimits(request_timeout=-1)


def test_nexttok_serve_runs_and_exits_cleanly_on_sigint(chat_model_dir):
    """The real command: scheduler in the main thread, uvicorn in another; Ctrl-C ends a stream
    that is still open with an error event and [DONE], and the process exits 0."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "nexttok", "serve", str(chat_model_dir), "--port", str(port),
                                "--served-model-name", MODEL, "--log-level", "warning"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.2)
        assert _complete(url, prompt="hi", max_tokens=4).json()["usage"]["completion_tokens"] == 4
        events: list = []
        reader = threading.Thread(target=lambda: events.extend(
            _stream_events(url, {"prompt": "Forever", "max_tokens": 3000, "temperature": 1.0, **NO_EOS})))
        reader.start()
        while _metrics(url)["nexttok_running"] < 1:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        reader.join(timeout=30)
        assert events[-1] == "[DONE]" and "shutting down" in events[-2]["error"]["message"]
    finally:
        if process.poll() is None:
            process.kill()
