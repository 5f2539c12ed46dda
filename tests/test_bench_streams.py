"""bench_streams: nexttok serve against llama-server -np N under N concurrent streams. What can fail
without llama.cpp is tested here: --streams parsing, the percentile math, a missing llama-server,
and the nexttok side end to end (a real `nexttok serve` child on the tiny test model, two streams,
one round). Never a timed test: the figures are the bench's, not the tests'."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from nexttok import bench_streams
from nexttok.bench_streams import Request, Round, Spec, llama_server, parse_streams, percentile, run_streams

# A stand-in server: /health, /v1/models and streamed /v1/completions of max_tokens one-token chunks
# (with a usage chunk, as llama-server sends, or without: then the chunks are counted); it logs its
# name, OMP_NUM_THREADS and arguments, one line per start.
FAKE_SERVER = """#!{python}
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(" ".join([{name!r}, os.environ.get("OMP_NUM_THREADS", "-")] + args) + "\\n")
if {fail!r}:
    sys.exit("error: failed to load model")

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({{"data": [{{"id": "fake"}}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{{"choices": [{{"text": "a"}}]}}] * request["max_tokens"]
        chunks += [{{"choices": [], "usage": {{"completion_tokens": request["max_tokens"]}}}}] if {usage!r} else []
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
        self.wfile.write(b"data: [DONE]\\n\\n")

ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


def fake_server(folder, name: str, *, usage: bool = True, fail: bool = False):
    script = folder / name
    script.write_text(FAKE_SERVER.format(python=sys.executable, calls=str(folder / "calls"), name=name, fail=fail,
                                         usage=usage))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_streams_parse_to_counts_and_bad_ones_are_one_line_errors():
    assert parse_streams("1,4,8") == [1, 4, 8]
    assert parse_streams("16") == [16]
    with pytest.raises(ValueError, match=r"--streams '0': each stream count must be >= 1"):
        parse_streams("0")
    with pytest.raises(ValueError, match=r"--streams 'x': a comma-separated list"):
        parse_streams("x")
    with pytest.raises(ValueError, match=r"--streams '1,,2'"):
        parse_streams("1,,2")


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4, 1, 3, 2], 95) == pytest.approx(3.85)
    assert percentile([7.0], 95) == 7.0
    assert percentile(list(range(1, 101)), 0) == 1 and percentile(list(range(1, 101)), 100) == 100
    with pytest.raises(ValueError):
        percentile([], 50)


def test_a_rounds_aggregate_is_its_tokens_over_its_wall_time():
    rnd = Round([Request(0.1, 10, started=0.0, ended=2.0), Request(0.2, 30, started=0.5, ended=4.0)])
    assert rnd.tokens == 40 and rnd.tokens_per_s == 10.0


def test_a_missing_llama_server_is_a_reason_not_an_error(tmp_path, monkeypatch):
    (tmp_path / "llama-bench").write_text("")  # a build folder with llama-bench but no llama-server
    assert llama_server(str(tmp_path)) == (None, f"no llama-server in {tmp_path}")
    binary, why = llama_server("/nonexistent")
    assert binary is None and "no llama-bench in /nonexistent" in why


def test_bad_streams_from_the_command_line_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nexttok", "bench", str(tmp_path), "--streams", "x"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--streams 'x'" in result.stderr


def test_the_nexttok_side_runs_end_to_end(chat_model_dir, tmp_path):
    """A real `nexttok serve` child, two concurrent streams, one round: the report has the figures."""
    spec = Spec(str(chat_model_dir), None, threads=1, rounds=1, max_tokens=8, logs=tmp_path)
    heard = []
    text = run_streams(spec, [2], on_result=lambda n, got: heard.append((n, got)))
    [(n, got)] = heard
    assert n == 2 and list(got) == ["nexttok"]
    [rnd] = got["nexttok"]
    assert len(rnd.requests) == 2
    assert all(r.tokens > 0 and 0 < r.ttft <= r.ended - r.started for r in rnd.requests)
    assert rnd.tokens_per_s > 0
    row = next(line for line in text.splitlines() if line.split()[:2] == ["2", "nexttok"])
    assert row.split()[4] == str(rnd.tokens)  # tokens per round, after "median (range)"
    assert "llama-server" not in text.splitlines()[1:]  # nexttok alone: no llama-server row, no ratio
    assert (tmp_path / "streams-nexttok-2.log").is_file()


def test_both_engines_alternate_one_at_a_time_and_the_ratio_is_printed(tmp_path, monkeypatch):
    """Stand-ins for both servers: the rounds alternate who goes first, llama-server gets -np N, a
    context of N slots and -t, both get the threads, and the report has a ratio line per N."""
    binary = fake_server(tmp_path, "llama-server")
    ours = fake_server(tmp_path, "nexttok", usage=False)
    monkeypatch.setattr(bench_streams, "nexttok_command", lambda model, port, n: [str(ours), "--port", str(port)])
    spec = Spec("m.gguf", binary, threads=3, rounds=2, max_tokens=4, logs=tmp_path)
    text = run_streams(spec, [1, 3])
    calls = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    assert [c[0] for c in calls] == ["nexttok", "llama-server", "llama-server", "nexttok"] * 2
    assert {c[1] for c in calls} == {"3"}  # OMP_NUM_THREADS: torch's threads in nexttok serve
    port = calls[-2][calls[-2].index("--port") + 1]
    assert calls[-2][2:] == ["-m", "m.gguf", "-np", "3", "-c", "3072", "-t", "3", "--host", "127.0.0.1", "--port", port]
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [r[:2] for r in rows] == [["1", "nexttok"], ["1", "llama-server"], ["1", "nexttok/llama-server"],
                                     ["3", "nexttok"], ["3", "llama-server"], ["3", "nexttok/llama-server"]]
    assert rows[0][4] == rows[1][4] == "4" and rows[3][4] == rows[4][4] == "12"  # chunks counted, usage read
    assert rows[2][3].endswith("x")


def test_a_server_that_will_not_start_is_one_line(tmp_path):
    binary = fake_server(tmp_path, "llama-server", fail=True)
    spec = Spec("m.gguf", binary, rounds=1, max_tokens=4, logs=tmp_path)
    with pytest.raises(RuntimeError, match=r"llama-server exited \(1\): error: failed to load model \(log: "):
        bench_streams.one_round(spec, "llama-server", 2)
