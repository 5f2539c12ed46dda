"""`nexttok run` and `nexttok chat` through a running server (as `ollama run` talks to `ollama
serve`), and in this process when there is none, it does not serve the model, or an option needs
the model here: one dim line says which. Through the server, greedy tokens are the in-process ones."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil

import pytest
from rich.console import Console

from live_server import LiveServer
from nexttok.checkpoints import store
from nexttok.checkpoints.store import Manifest
from nexttok.cli import build_parser, client, main
from nexttok.server import ServerLimits, create_app

GREEDY = ["--temperature", "0", "--max-tokens", "8"]
STORED = "hf.co/test-org/Tiny-GGUF:Q8_0"


def stored(data: bytes, name: str) -> Manifest:
    """data stored under name, as a pull leaves it (no hub needed)."""
    sha256 = hashlib.sha256(data).hexdigest()
    blob = store.blob_path(sha256)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    return store.write(Manifest(name, sha256, len(data), None, {"format": "gguf"}))


@pytest.fixture
def live(served, tiny_ggufs, tmp_path, monkeypatch):
    """A server over the pinned "tiny", a store holding STORED, NEXTTOK_HOST pointed at the server."""
    monkeypatch.setenv("NEXTTOK_MODELS", str(tmp_path / "models"))
    stored(tiny_ggufs["tiny-Q8_0.gguf"], STORED)
    app = create_app([dataclasses.replace(served, scheduler=None)], limits=ServerLimits(keep_alive=300.0))
    # the CLI's probe gives a server 0.5 s: a fresh clone's first request there also compiles the
    # modules its route imports (no __pycache__ yet), which took longer once; what is tested here
    # is where the command runs, not how fast the probe is
    monkeypatch.setattr(client, "PROBE_TIMEOUT", 10.0)
    with LiveServer(app) as server:
        monkeypatch.setenv("NEXTTOK_HOST", server.url.removeprefix("http://"))
        server.app = app
        yield server


def _run(capsys, *argv: str) -> tuple[str, list[str]]:
    assert main(["run", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err.strip().splitlines()


def _trace_ids(path) -> list[int]:
    return [line["id"] for line in map(json.loads, path.read_text().splitlines()) if line["type"] == "step"]


def test_run_goes_through_the_server_with_the_in_process_greedy_tokens(live, capsys, tmp_path, chat_model_dir):
    text, err = _run(capsys, "tiny", "The capital of France is", *GREEDY, "--trace", str(tmp_path / "server.jsonl"))
    assert err[0] == f"through the server at {live.url} (tiny stays loaded there)"
    assert err[-1].startswith("8 tokens (length); first token ") and "ms (from the request); decode " in err[-1]
    here, err_here = _run(capsys, str(chat_model_dir), "The capital of France is", *GREEDY, "--no-server",
                          "--trace", str(tmp_path / "here.jsonl"))  # the file the server serves as tiny
    assert err_here[0] == "in this process (--no-server)"
    assert text == here and len(text.strip()) > 0
    ids = _trace_ids(tmp_path / "server.jsonl")
    assert ids == _trace_ids(tmp_path / "here.jsonl") and len(ids) == 8
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "server.jsonl")]) == 0  # the server's trace replays here
    assert "8 steps replayed; largest logprob change" in capsys.readouterr().err


def test_a_stored_model_stays_loaded_in_the_server_between_runs(live, capsys, tiny_ggufs):
    pool = live.app.state.pool
    text, err = _run(capsys, "test-org/tiny-gguf:q8_0", "Hello", *GREEDY)
    assert err[0] == f"through the server at {live.url} (test-org/tiny-gguf:q8_0 stays loaded there)"
    model = pool.models[STORED].model
    again, _ = _run(capsys, STORED, "Hello", *GREEDY)
    assert again == text and pool.models[STORED].model is model  # not loaded again
    here, _ = _run(capsys, STORED, "Hello", *GREEDY, "--no-server")
    assert here == text


def test_run_stays_in_this_process_when_it_must(live, capsys, chat_model_dir):
    _, err = _run(capsys, str(chat_model_dir), "Hi", *GREEDY)
    assert err[0] == "in this process: a path is loaded here, never by a server"
    _, err = _run(capsys, STORED, "Hi", *GREEDY, "--json")
    assert err[0] == "in this process: --json needs the model here"
    _, err = _run(capsys, STORED, "Hi", *GREEDY, *[f"--stop=s{i}" for i in range(5)])
    assert err[0] == "in this process: more than 4 --stop needs the model here"


def test_a_model_the_server_does_not_serve_runs_here(live, capsys, monkeypatch, tiny_ggufs, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_ggufs["tiny-Q4_0.gguf"])
    stored(tiny_ggufs["tiny-Q4_0.gguf"], "only-here")
    monkeypatch.setattr(live.app.state.pool, "loadable", lambda name: None)  # as a server with another store
    _, err = _run(capsys, "only-here", "Hi", *GREEDY)
    assert err[0].startswith(f"in this process ({live.url} does not serve only-here: The model 'only-here' does "
                             "not exist")


def test_with_no_server_run_is_in_process_as_before(capsys, chat_model_dir, monkeypatch):
    shutil.rmtree(chat_model_dir / "nothing", ignore_errors=True)
    _, err = _run(capsys, str(chat_model_dir), "Hi", *GREEDY)  # conftest's NEXTTOK_HOST: nothing listens
    assert err[0] == "in this process: a path is loaded here, never by a server"
    monkeypatch.setenv("NEXTTOK_HOST", "127.0.0.1:9")
    monkeypatch.setenv("NEXTTOK_MODELS", str(chat_model_dir / "nothing"))
    _, err = _run(capsys, "default", "Hi", "--temperature", "0", "--max-tokens", "2")
    assert err[0] == "in this process (no nexttok server at http://127.0.0.1:9)"


def _chat(argv: list[str]):
    from nexttok.cli.chat import _session

    args = build_parser().parse_args(["chat", *argv])
    text = io.StringIO()
    return _session(args, Console(file=text, soft_wrap=True)), text


def test_chat_through_the_server_answers_as_in_process(live, capsys, chat_model_dir):
    remote, _ = _chat(["tiny", "--temperature", "0", "--max-tokens", "8", "--system", "Be brief."])
    assert capsys.readouterr().err.strip() == f"through the server at {live.url} (tiny stays loaded there)"
    here, _ = _chat([str(chat_model_dir), "--temperature", "0", "--max-tokens", "8", "--system", "Be brief.",
                     "--no-server"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == "in this process (--no-server)"  # once loaded
    assert remote.context == 4096 and here.context == 4096
    for message in ("Hello?", "And then?"):
        remote.handle(message)
        here.handle(message)
    assert remote.chat.turns == here.chat.turns and len(remote.chat.turns) == 4
    assert remote.chat.used() == here.chat.used()  # the server's template, the same ids
    remote.handle("/clear")
    assert remote.chat.turns == []


def test_chat_with_trace_stays_here(live, capsys, tmp_path):
    _chat([STORED, "--trace", str(tmp_path / "t.jsonl")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == "in this process: --trace needs the model here"

