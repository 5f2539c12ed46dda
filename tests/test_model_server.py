"""The server's models as Ollama manages them: stored models loaded on first use, kept for
keep_alive, the least recently used unloaded past max_loaded, requests waiting while their model
loads; /api/pull, /api/delete, /api/copy, /api/tags and /api/ps through Ollama's official client;
`nexttok ps`. The hub is tests/fake_hub.py (HF_ENDPOINT), never the network."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import hashlib
import threading
import time
import weakref

import ollama
import openai
import pytest

from fake_hub import FakeHub
from live_server import LiveServer
from nexttok.checkpoints import hub_pull, store
from nexttok.cli import main
from nexttok.server import ServerLimits, create_app, load_served

REPO = "test-org/Tiny-GGUF"
NAME = f"hf.co/{REPO}:Q8_0"
GREEDY = {"temperature": 0, "num_predict": 6}


@pytest.fixture(scope="module")
def hub(tiny_ggufs, tmp_path_factory):
    """The fake hub, and a model store of this module's own holding NAME and its copies a, b, c."""
    with pytest.MonkeyPatch.context() as patch, FakeHub({REPO: tiny_ggufs}) as fake:
        patch.setenv("HF_ENDPOINT", fake.url)
        patch.setenv("NEXTTOK_MODELS", str(tmp_path_factory.mktemp("store")))
        hub_pull.pull(NAME)
        for copy in ("a", "b", "c"):
            store.copy(NAME, copy)
        yield fake


@pytest.fixture
def live(served, hub):
    """A server over the pinned test model "tiny", max_loaded 2, whose loads are recorded (and
    slowed by live.delay seconds)."""
    loads: list[str] = []
    state = {"delay": 0.0}

    def loader(name: str):
        loads.append(name)
        time.sleep(state["delay"])
        return load_served(name)

    app = create_app([dataclasses.replace(served, scheduler=None)], loader=loader,
                     limits=ServerLimits(max_loaded=2, keep_alive=300.0))
    with LiveServer(app) as server:
        server.app, server.loads, server.state = app, loads, state
        server.client = ollama.Client(host=server.url)
        yield server


def _loaded(live) -> list[str]:
    return [m.model for m in live.client.ps().models]


def _until_gone(live, name: str, seconds: float = 5.0) -> float:
    """Seconds until /api/ps no longer lists name (fails after `seconds`)."""
    start = time.monotonic()
    while name in _loaded(live):
        assert time.monotonic() - start < seconds, f"{name} still loaded after {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _expires_in(live, name: str) -> float:
    found = next(m for m in live.client.ps().models if m.model == name)
    return (found.expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()


def test_pull_streams_progress_then_tags_list_the_model(live, tiny_ggufs):
    data = tiny_ggufs["tiny-F16.gguf"]
    events = list(live.client.pull(f"hf.co/{REPO}:F16", stream=True))
    assert events[0].status == "pulling manifest" and events[-1].status == "success"
    assert [e.status for e in events if not e.digest][-3:] == ["verifying sha256 digest", "writing manifest",
                                                               "success"]
    download = [e for e in events if e.digest]
    assert download[-1].completed == download[-1].total == len(data)
    assert download[-1].digest == f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert live.client.pull(f"{REPO}:F16").status == "success"  # stream false: one object; stored already
    tags = {m.model: m for m in live.client.list().models}
    assert list(tags)[0] == "tiny:latest" and {NAME, f"hf.co/{REPO}:F16", "a:latest"} <= set(tags)
    pulled = tags[f"hf.co/{REPO}:F16"]
    assert pulled.size == len(data) and pulled.digest == hashlib.sha256(data).hexdigest()
    assert (pulled.details.family, pulled.details.quantization_level, pulled.details.format) == ("llama", "F16", "gguf")
    assert _loaded(live) == ["tiny:latest"]  # pulling loads nothing
    with pytest.raises(ollama.ResponseError) as caught:
        live.client.pull(f"{REPO}:Q5_K_M")
    assert caught.value.status_code == 404 and "has no GGUF file for Q5_K_M" in caught.value.error
    store.remove(f"hf.co/{REPO}:F16")


def test_a_stored_model_loads_on_first_use_and_answers_as_in_process(live, hub):
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.loop import generate, prompt_ids_for
    from nexttok.generation.sampling import SamplingParams

    assert _loaded(live) == ["tiny:latest"]
    reply = live.client.generate(model=f"{REPO.lower()}:q8_0", prompt="Hello there", raw=True, options=GREEDY)
    checkpoint = load_checkpoint(store.find(NAME).blob)
    ids = prompt_ids_for(checkpoint.model, checkpoint.tokenizer, "Hello there")
    alone = generate(checkpoint.model, checkpoint.tokenizer, ids, SamplingParams(temperature=0), max_tokens=6)
    assert reply.response == alone.text and reply.eval_count == 6
    assert reply.load_duration > reply.prompt_eval_duration  # the load is in it, as in Ollama's
    assert _loaded(live) == ["tiny:latest", NAME] and live.loads == [NAME]
    assert 290 < _expires_in(live, NAME) <= 300  # the server's default keep_alive
    live.client.generate(model=NAME, prompt="Hi", raw=True, options=GREEDY)
    assert live.loads == [NAME]  # loaded once


def test_keep_alive_minus_one_keeps_zero_unloads_and_the_memory_goes(live, hub):
    live.client.generate(model=NAME, prompt="Hi", raw=True, options=GREEDY, keep_alive=-1)
    assert next(m for m in live.client.ps().models if m.model == NAME).expires_at.year > 2200
    live.client.chat(model=NAME, messages=[], keep_alive="10m")
    assert 590 < _expires_in(live, NAME) <= 600
    model = weakref.ref(live.app.state.pool.models[NAME].model)
    done = live.client.generate(model=NAME, prompt="Hi", raw=True, options=GREEDY, keep_alive=0)
    assert done.done and _until_gone(live, NAME) < 5.0  # once idle (and a second after it arrived)
    deadline = time.monotonic() + 5
    while model() is not None and time.monotonic() < deadline:  # its scheduler's thread ends first
        gc.collect()
        time.sleep(0.05)
    assert model() is None  # nothing holds the unloaded model
    assert live.client.generate(model=NAME).done_reason == "load" and NAME in _loaded(live)
    assert live.client.generate(model=NAME, keep_alive=0).done_reason == "unload"  # Ollama's way to unload now
    assert NAME not in _loaded(live)
    assert live.client.chat(model="tiny", messages=[], keep_alive=0).done_reason == "unload"
    assert _loaded(live) == ["tiny:latest"]  # a model the server started with stays
    assert live.loads == [NAME, NAME]


def test_past_max_loaded_the_least_recently_used_is_unloaded(live, hub):
    for name in ("a", "b", "a", "c"):
        live.client.generate(model=name, prompt="Hi", raw=True, options=GREEDY)
    assert _loaded(live) == ["tiny:latest", "a:latest", "c:latest"]  # b was used least recently
    live.client.generate(model="b", prompt="Hi", raw=True, options=GREEDY)
    assert _loaded(live) == ["tiny:latest", "c:latest", "b:latest"]  # then a
    assert live.loads == ["a:latest", "b:latest", "c:latest", "b:latest"]


def test_requests_wait_while_their_model_loads_and_others_do_not(live, hub):
    live.state["delay"] = 1.5
    results, took = {}, {}

    def ask(key: str, model: str) -> None:
        start = time.monotonic()
        results[key] = ollama.Client(host=live.url).generate(model=model, prompt="Hi", raw=True, options=GREEDY)
        took[key] = time.monotonic() - start

    waiting = [threading.Thread(target=ask, args=(f"a{i}", "a")) for i in range(3)]
    for thread in waiting:
        thread.start()
    time.sleep(0.3)  # the load is under way
    ask("tiny", "tiny")  # a loaded model answers meanwhile
    for thread in waiting:
        thread.join(timeout=60)
    assert live.loads == ["a:latest"]  # one load for the three requests
    assert took["tiny"] < 1.0 and all(took[f"a{i}"] >= 1.4 for i in range(3))
    assert len({results[f"a{i}"].response for i in range(3)}) == 1 and results["a0"].eval_count == 6


def test_copy_and_delete_over_the_api(live, hub):
    live.client.copy(NAME, "mine")
    assert "mine:latest" in [m.model for m in live.client.list().models]
    live.client.chat(model="mine", messages=[{"role": "user", "content": "Hi"}], options=GREEDY)
    assert "mine:latest" in _loaded(live)
    live.client.delete("mine")
    assert "mine:latest" not in _loaded(live) and "mine:latest" not in [m.model for m in live.client.list().models]
    assert store.find(NAME).blob.is_file()  # NAME still uses the file
    with pytest.raises(ollama.ResponseError) as caught:
        live.client.delete("mine")
    assert caught.value.status_code == 404 and caught.value.error == "model 'mine' not found"


def test_openai_routes_load_stored_models_and_nothing_else(live, hub):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    listed = [m.id for m in client.models.list().data]
    assert listed[0] == "tiny" and {NAME, "a:latest"} <= set(listed)
    assert client.models.retrieve(NAME).id == NAME and NAME not in _loaded(live)  # a card loads nothing
    reply = client.completions.create(model=f"{REPO}:Q8_0", prompt="Hello there", max_tokens=6, temperature=0)
    assert reply.model == NAME and NAME in _loaded(live) and 290 < _expires_in(live, NAME) <= 300
    for name in ("/etc", "../tiny", str(store.find(NAME).blob), "test-org/other:Q8_0"):
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.completions.create(model=name, prompt="x", max_tokens=1)
    assert live.loads == [NAME]


def test_nexttok_ps_shows_what_the_server_holds(live, hub, monkeypatch, capsys):
    monkeypatch.setenv("NEXTTOK_HOST", live.url)
    live.client.generate(model="a", prompt="Hi", raw=True, options=GREEDY)
    assert main(["ps"]) == 0
    lines = [line.split("    ") for line in capsys.readouterr().out.strip().splitlines()]
    rows = [[cell.strip() for cell in line if cell.strip()] for line in lines]
    assert rows[0] == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert rows[1][0] == "tiny:latest" and rows[1][3] == "100% CPU" and rows[1][5] == "Forever"
    assert rows[2][0] == "a:latest" and rows[2][1] == store.find("a").sha256[:12] and rows[2][4] == "4096"
    assert rows[2][5] == "4 minutes from now"
    live.stop()
    assert main(["ps"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: no nexttok server answers at {live.url} (start one: nexttok "
                                               "serve; NEXTTOK_HOST says where to look)")


@pytest.mark.parametrize("value, seconds", [(None, 300.0), (0, 0.0), (-1, None), ("-1", None), ("5m", 300.0),
                                            ("1h30m", 5400.0), ("1.5s", 1.5), ("300", 300.0), ("-1m", None),
                                            (2.5, 2.5)])
def test_keep_alive_reads_as_ollama_does(value, seconds):
    from nexttok.server.pool import keep_alive_seconds

    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "m", "1h-5m", "", "1x"])
def test_a_bad_keep_alive_is_refused(live, value):
    with pytest.raises(ollama.ResponseError) as caught:
        live.client.generate(model="tiny", keep_alive=value)
    assert caught.value.status_code == 400 and "keep_alive" in caught.value.error


def test_serve_takes_keep_alive_and_max_loaded(monkeypatch, capsys):
    import nexttok.server as server

    seen = []
    monkeypatch.setattr(server, "load_served", lambda *a, **k: dataclasses.make_dataclass("M", ["name"])("m"))
    monkeypatch.setattr(server, "create_app", lambda served, **k: seen.append(k["limits"]))
    monkeypatch.setattr(server, "serve_in_main_thread", lambda *a, **k: None)
    monkeypatch.setattr("nexttok.cli.serve._listen", lambda host, port: None)
    assert main(["serve", "m"]) == 0
    assert main(["serve", "m", "--keep-alive", "1h30m", "--max-loaded", "1"]) == 0
    assert main(["serve", "m", "--keep-alive", "-1"]) == 0
    assert [(s.keep_alive, s.max_loaded) for s in seen] == [(300.0, 3), (5400.0, 1), (None, 3)]
    capsys.readouterr()
    assert main(["serve", "m", "--keep-alive", "soon"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --keep-alive: keep_alive 'soon' is not a duration (seconds, or "
                                               'such as "5m", "1h30m", "-1")')
    assert main(["serve", "m", "--max-loaded", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-loaded must be >= 1, got 0"


def test_the_reaper_goes_on_after_a_failure(caplog):
    import asyncio
    import contextlib

    from nexttok.server.pool import TICK, ModelPool

    pool = ModelPool([], loader=load_served, attach=lambda served: None, loadable=lambda name: None)
    looks = []

    async def reap(now: float) -> None:
        looks.append(now)
        if len(looks) == 1:
            raise RuntimeError("a scheduler that would not stop")

    pool._reap = reap

    async def watch() -> None:
        task = asyncio.create_task(pool.reap_forever())
        await asyncio.sleep(TICK * 4.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(watch())
    assert len(looks) >= 3 and "unloading an idle model failed" in caplog.text
    assert "a scheduler that would not stop" in caplog.text  # with its traceback
