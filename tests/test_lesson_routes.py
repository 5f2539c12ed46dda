"""The lesson's JSON routes return the lesson functions' numbers, refuse bad input with an
OpenAI-shaped 400 naming the parameter, and are in /openapi.json; the vocabulary is a route of its
own (an ETag, not a copy in every session), and the page is served as ES modules."""

from __future__ import annotations

import httpx
import pytest
import torch

from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.lesson import sections as lesson
from nexttok.lesson.session import ExplainSession

PROMPT = "The king and the queen ate an apple"


@pytest.fixture(scope="module")
def live(tiny_live):
    server, served = tiny_live
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=120)  # noqa: E731
    return post, served, server


def _session(post, **extra) -> str:
    return post("/explain/sessions", {"prompt": PROMPT, "seed": 3, **extra}).json()["session"]


def test_lens_attention_and_detail_routes_equal_the_functions(live):
    post, served, _ = live
    key = _session(post)
    step = post(f"/explain/sessions/{key}/step", {"temperature": 0}).json()
    ids = served.tokenizer.encode(PROMPT) + [step["step"]["token_id"]]
    seen = lesson.inspect(served.model, ids)
    view = post(f"/explain/sessions/{key}/lens", {"top_n": 3}).json()
    assert [t["id"] for t in view["tokens"]] == ids and view["position"] == len(ids) - 1
    expected = lesson.lens(served.model, served.tokenizer, seen, -1, 3)
    assert [[r["id"] for r in layer["top"]] for layer in view["layers"]] == \
        [[r["id"] for r in layer["top"]] for layer in expected["layers"]]
    last = seen.logits[-1].softmax(-1)
    assert view["layers"][-1]["top"][0]["p"] == pytest.approx(float(last.max()), rel=1e-4)
    matrix = post(f"/explain/sessions/{key}/attention", {"layer": 1, "head": 2}).json()
    assert matrix["heads"] == served.model.config.num_attention_heads
    assert torch.tensor(matrix["weights"]) == pytest.approx(seen.weights[1, 2], abs=1e-4)
    mean = post(f"/explain/sessions/{key}/attention", {"layer": 0, "head": None}).json()
    assert torch.tensor(mean["weights"]) == pytest.approx(seen.weights[0].mean(0), abs=1e-4)
    read = lesson.inspect(served.model, ids[:-1])  # what the step read: the prompt
    assert len(step["attention_mean"]) == len(step["attention"]) == served.model.config.num_hidden_layers
    for layer, (heads, mean) in enumerate(zip(step["attention"], step["attention_mean"], strict=True)):
        assert len(heads) == served.model.config.num_attention_heads
        assert mean == pytest.approx(torch.tensor(heads).mean(0).tolist(), abs=1e-4)  # of the heads it sent
        assert mean == pytest.approx(read.weights[layer].mean(0)[-1].tolist(), abs=2e-4)  # the last position's
    detail = post(f"/explain/sessions/{key}/attention/detail", {"layer": 1, "head": 0, "query": 4}).json()
    assert detail["weights"] == pytest.approx(seen.weights[1, 0, 4, :5].tolist(), abs=1e-4)
    assert len(detail["keys"]) == 5 and len(detail["q"]) == served.model.config.head_dim
    assert detail["output"] == pytest.approx((seen.weights[1, 0, 4, :5] @ seen.v[1][0, :5]).tolist(), abs=1e-4)
    bad = post(f"/explain/sessions/{key}/attention", {"layer": 99})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "layer"
    bad = post(f"/explain/sessions/{key}/lens", {"node": 500})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "node"


def test_step_reports_cache_stop_context_and_logits(live):
    post, served, _ = live
    key = _session(post, context=12)
    first = post(f"/explain/sessions/{key}/step", {"temperature": 0}).json()
    prompt_tokens = len(served.tokenizer.encode(PROMPT))
    per_token = lesson.kv_cache_bytes_per_token(served.model, torch.float32)
    cache = first["cache"]
    assert {k: cache[k] for k in ("tokens", "bytes", "bytes_per_token", "capacity", "dtype")} == \
        {"tokens": prompt_tokens, "bytes": prompt_tokens * per_token, "bytes_per_token": per_token, "capacity": 12,
         "dtype": "float32"}
    # every layer of the test model keeps every key: generation's cache holds what this one does
    assert cache["held"] == {"tokens": prompt_tokens, "full": prompt_tokens * per_token, "sliding": 0, "recurrent": 0,
                             "total": prompt_tokens * per_token, "all_full": prompt_tokens * per_token,
                             "sliding_slots": 0, "sliding_room": 0}
    assert first["context"] == {"used": prompt_tokens + 1, "limit": 12}
    session = ExplainSession(served.model, served.tokenizer, PROMPT, max_len=12)
    logits = session.forward(0).logits
    assert first["stop"]["p"] == pytest.approx(float(logits.softmax(-1)[served.model.config.eos_token_id].sum()),
                                               rel=1e-4)
    assert first["rows"][0]["logit"] == pytest.approx(float(logits.max()), rel=1e-4)
    assert first["rest"]["p"] == pytest.approx(1 - sum(r["p"] for r in first["rows"]), abs=1e-5)
    uncached = post(f"/explain/sessions/{key}/step", {"temperature": 0, "use_cache": False}).json()
    assert uncached["timing"]["cached"] is False and uncached["timing"]["tokens"] == prompt_tokens + 1
    reasons = []
    while True:
        view = post(f"/explain/sessions/{key}/step", {"temperature": 0})
        if view.status_code != 200:
            break
        reasons.append(view.json()["stop"]["reason"])
    assert view.json()["error"]["code"] == "context_length_exceeded" and reasons[-1] == "length"
    bad = post("/explain/sessions", {"prompt": PROMPT, "context": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "context"


def test_tokens_embeddings_map_and_positions(live):
    post, served, _ = live
    view = post("/explain/tokens", {"text": "strawberry pie", "price_input": 2.5, "output_tokens": 1000}).json()
    ids = served.tokenizer.encode("strawberry pie")
    assert [p["id"] for p in view["pieces"]] == ids and view["tokens"] == len(ids)
    assert view["input_cost"] == pytest.approx(len(ids) * 2.5 / 1e6) and view["output_cost"] == pytest.approx(6e-4)
    near = post("/explain/embeddings", {"word": "king", "k": 5}).json()
    ids, vector = lesson.word_vector(served.model, served.tokenizer, "king")
    assert [n["id"] for n in near["neighbors"]] == [i for i, _ in lesson.neighbors(served.model, vector, 5, ids)]
    assert near["dimensions"] == served.model.config.hidden_size and len(near["vector"]) == 16
    words = ["king", "queen", "apple", "banana"]
    mapped = post("/explain/embeddings/map", {"words": words}).json()
    vectors = torch.stack([lesson.word_vector(served.model, served.tokenizer, w)[1] for w in words])
    assert torch.tensor(mapped["cosine"]) == pytest.approx(lesson.cosine_matrix(vectors), abs=1e-4)
    assert len(mapped["points"]) == 4 and len(mapped["explained"]) == 2
    rope = post("/explain/positions", {"count": 8, "distance": 32}).json()
    assert rope["kind"] == "rope" and len(rope["score"]) == 33 and rope["score"][0] == pytest.approx(1.0)
    for path, body, param in [("/explain/tokens", {"text": "x", "price_input": -1}, "price_input"),
                              ("/explain/embeddings", {"word": ""}, "word"),
                              ("/explain/embeddings/map", {"words": ["a"]}, "words"),
                              ("/explain/positions", {"count": 100000}, "count")]:
        bad = post(path, body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text


def test_experiments(live):
    post, served, _ = live
    view = post("/explain/experiments/repeat", {"prompt": PROMPT, "max_tokens": 6, "seed": 4}).json()
    runs = view["runs"]
    assert [r["temperature"] for r in runs] == [0, 0, 1, 1]
    greedy = generate(served.model, served.tokenizer, PROMPT, SamplingParams(temperature=0), max_tokens=6)
    assert [t["id"] for t in runs[0]["tokens"]] == greedy.token_ids == [t["id"] for t in runs[1]["tokens"]]
    assert view["divergence"]["temperature_0"] is None
    sampled = generate(served.model, served.tokenizer, PROMPT, SamplingParams(temperature=1, seed=5), max_tokens=6)
    assert [t["id"] for t in runs[2]["tokens"]] == sampled.token_ids
    timed = post("/explain/experiments/length", {"prompt": PROMPT, "lengths": [3, 12], "price_output": 10}).json()
    short, long = timed["runs"]
    assert (short["tokens"], long["tokens"]) == (3, 12) and len(long["step_seconds"]) == 12
    assert long["output_cost"] == pytest.approx(12 * 10 / 1e6)
    bad = post("/explain/experiments/length", {"prompt": PROMPT, "lengths": [0]})
    assert bad.status_code == 400 and "lengths" in bad.json()["error"]["param"]


def test_lesson_routes_are_in_openapi(live):
    _, _, server = live
    paths = httpx.get(server.url + "/openapi.json", timeout=60).json()["paths"]
    for path in ["/explain/tokens", "/explain/embeddings", "/explain/embeddings/map", "/explain/positions",
                 "/explain/experiments/repeat", "/explain/experiments/length", "/explain/experiments/speculative",
                 "/explain/traces/diff", "/explain/sessions/{key}/trace", "/explain/sessions/{key}/lens",
                 "/explain/sessions/{key}/attention", "/explain/sessions/{key}/attention/detail", "/explain/vocab"]:
        assert path in paths


def test_vocab_is_a_route_of_its_own_with_an_etag(live):
    post, served, server = live
    started = post("/explain/sessions", {"prompt": PROMPT}).json()
    assert set(started) == {"session", "model", "prompt", "tree"}  # no vocabulary in a session
    url = server.url + "/explain/vocab"
    got = httpx.get(url, timeout=120)
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    vocab, size = got.json(), served.model.config.vocab_size
    assert (vocab["model"], vocab["vocab_size"]) == (started["model"]["name"], started["model"]["vocab_size"])
    assert vocab["texts"] == [lesson.token_text(served.tokenizer, i) for i in range(size)]  # ids 0..size-1
    assert len(vocab["texts"]) == size
    # the texts the session API reports for tokens are the vocabulary's
    assert [vocab["texts"][t["id"]] for t in started["prompt"]] == [t["text"] for t in started["prompt"]]
    step = post(f"/explain/sessions/{started['session']}/step", {"temperature": 0, "top_n": 20}).json()
    assert [vocab["texts"][r["id"]] for r in step["rows"]] == [r["text"] for r in step["rows"]]
    assert vocab["texts"][step["step"]["token_id"]] == step["step"]["token_text"]
    assert [vocab["texts"][t["id"]] for t in step["generated"]] == [t["text"] for t in step["generated"]]

    etag = got.headers["etag"]  # a reload revalidates: the same ETag answers 304 with no body
    assert etag.startswith('"') and got.headers["cache-control"] == "no-cache"
    for header in (etag, f'"other", W/{etag}', "*"):
        again = httpx.get(url, headers={"If-None-Match": header}, timeout=60)
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag, header
    stale = httpx.get(url, headers={"If-None-Match": '"other"'}, timeout=60)
    assert stale.status_code == 200 and stale.json() == vocab and stale.headers["etag"] == etag
    named = httpx.get(url, params={"model": served.name}, timeout=60)
    assert named.json() == vocab and named.headers["etag"] == etag
    unknown = httpx.get(url, params={"model": "no-such-model"}, timeout=60)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()["paths"]["/explain/vocab"]["get"]
    assert "If-None-Match" in spec["description"] and "304" in spec["responses"]
    assert [p["name"] for p in spec["parameters"]] == ["model", "if-none-match"]


def test_page_is_served_as_es_modules(live):
    _, _, server = live
    page = httpx.get(server.url + "/", timeout=60).text
    assert '<script type="module" src="/static/main.js"></script>' in page and page.count("<script") == 1
    for name in ("main.js", "app.js", "api.js", "sections/attention.js"):
        served = httpx.get(f"{server.url}/static/{name}", timeout=60)
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript"), name
