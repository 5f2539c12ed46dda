"""The OpenAI-compatible server on a real loopback port, driven by the official `openai` client
and by raw HTTP for the error cases."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch

from live_server import LiveServer
from nexttok.generation.loop import generate, stream
from nexttok.generation.sampling import SamplingParams
from nexttok.server import create_app

MODEL = "tiny"
KEY = "sk-test-key"


def _post(server, path, body, **kwargs):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=data, headers={"Content-Type": "application/json"},
                      timeout=60, **kwargs)


def test_completion_matches_the_library(client, served):
    result = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9,
                                       top_p=0.95, seed=11)
    expected = generate(served.model, served.tokenizer, "Once upon a time",
                        SamplingParams(temperature=0.9, top_p=0.95, seed=11), max_tokens=12)
    choice = result.choices[0]
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert result.usage.completion_tokens == 12
    assert result.usage.prompt_tokens == len(served.tokenizer.encode("Once upon a time"))
    assert result.object == "text_completion" and result.model == MODEL


def test_completion_stream_equals_non_stream(client):
    args = dict(model=MODEL, prompt="The weather", max_tokens=15, temperature=1.0, seed=5)
    whole = client.completions.create(**args).choices[0].text
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 15 and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_and_chat_stream(client, served):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    result = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=3)
    prompt = served.chat_template.render(messages)
    expected = generate(served.model, served.tokenizer, served.tokenizer.encode(prompt),
                        SamplingParams(seed=3), max_tokens=10)
    assert result.choices[0].message.content == expected.text
    assert result.choices[0].message.role == "assistant"
    assert result.usage.prompt_tokens == len(served.tokenizer.encode(prompt))
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=3, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_logprobs(client):
    result = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=6, logprobs=True, top_logprobs=3, temperature=0)
    content = result.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the top token
        assert bytes(entry.bytes).decode("utf-8", "backslashreplace") == entry.token


def test_completion_logprobs(client, served):
    result = client.completions.create(model=MODEL, prompt="A", max_tokens=5, logprobs=2, temperature=0)
    logprobs = result.choices[0].logprobs
    steps = list(stream(served.model, served.tokenizer, "A", SamplingParams(temperature=0), max_tokens=5, top_n=2))
    assert len(steps) == 5
    assert logprobs.tokens == [s.token_text for s in steps]
    assert logprobs.token_logprobs == pytest.approx([s.logprob for s in steps], abs=1e-5)
    assert len(logprobs.top_logprobs) == 5
    for top, step in zip(logprobs.top_logprobs, steps, strict=True):
        expected = {a.text: a.logprob for a in step.top}
        assert len(step.top) == 2 and top  # really there, not empty
        assert top.keys() == expected.keys()
        assert all(top[text] == pytest.approx(expected[text], abs=1e-5) for text in expected)
        assert step.logprob == pytest.approx(step.top[0].logprob)  # greedy: the top token
    texts = [s.text for s in steps]
    assert logprobs.text_offset == [sum(len(t) for t in texts[:i]) for i in range(5)]
    assert result.choices[0].text == "".join(texts)
    # One value apart from stream() (which shares build_step with the server): the first token's
    # logprob straight from the served model's logits.
    ids = served.tokenizer.encode("A", add_special=True)
    assert result.usage.prompt_tokens == len(ids)
    with torch.inference_mode():
        first = torch.log_softmax(served.model(torch.tensor([ids]))[0, -1].float(), -1)
    token = int(first.argmax())  # greedy
    assert logprobs.tokens[0] == served.tokenizer.pieces([token])[0].text
    assert logprobs.token_logprobs[0] == pytest.approx(float(first[token]), abs=1e-5)


def test_seed_reproducibility_and_n(client):
    args = dict(model=MODEL, prompt="Seeds", max_tokens=10, temperature=1.2)
    first = client.completions.create(**args, seed=1234).choices[0].text
    assert client.completions.create(**args, seed=1234).choices[0].text == first
    assert client.completions.create(**args, seed=4321).choices[0].text != first
    several = client.completions.create(**args, seed=1234, n=3)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].text == first
    assert len({c.text for c in several.choices}) > 1
    assert several.usage.completion_tokens == 30
    assert several.usage.prompt_tokens == client.completions.create(**args, seed=1).usage.prompt_tokens  # once


def test_usage_counts_each_prompt_once_whatever_n(client, served):
    """OpenAI counts a prompt once however many choices it has (a user found 72 = 2 x 36)."""
    prompts = ["Seeds", "A longer prompt than the first one"]
    lengths = [len(served.tokenizer.encode(p)) for p in prompts]
    both = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=3, temperature=1.0, seed=5)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert both.usage.prompt_tokens == sum(lengths) and both.usage.completion_tokens == 12
    messages = [{"role": "user", "content": "Hi there"}]
    one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    two = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, n=2)
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, n=2, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens == one.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 6


def test_a_past_tool_call_reaches_the_prompt(client):
    """The official client sends an assistant's tool_calls and the tool's answer; the test model's
    ChatML template knows nothing of tools, and the call must still be in the prompt."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    answered = {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
    without = client.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        *asked, {"role": "assistant", "content": ""}, answered])
    with_call = client.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        *asked, {"role": "assistant", "content": None, "tool_calls": [call]}, answered])
    assert with_call.usage.prompt_tokens > without.usage.prompt_tokens + 10
    bad = {**call, "function": {"name": "get_weather", "arguments": "{city"}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, max_tokens=1, messages=[
            *asked, {"role": "assistant", "content": None, "tool_calls": [bad]}, answered])
    assert error.value.body["param"] == "messages" and "arguments must be a JSON object" in error.value.body["message"]


def test_stop_strings(client):
    args = dict(model=MODEL, prompt="Stop here", max_tokens=20, temperature=0)
    full = client.completions.create(**args).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop
    result = client.completions.create(**args, stop=[stop, "@@@@"]).choices[0]
    assert result.text == full[: full.find(stop)] and result.finish_reason == "stop"
    streamed = client.completions.create(**args, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == result.text


def test_models_health_tokenize(server, client, served):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    tokens = _post(server, "/tokenize", {"model": MODEL, "prompt": "héllo wörld"}).json()
    assert tokens["tokens"] == served.tokenizer.encode("héllo wörld") and tokens["count"] == len(tokens["tokens"])
    assert _post(server, "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]}).json() == {"prompt": "héllo wörld"}
    chat = _post(server, "/tokenize", {"messages": [{"role": "user", "content": "x"}]}).json()
    assert chat["count"] > 3


def test_openapi_spec_lists_the_routes(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/health"):
        assert path in spec["paths"]
    schema = spec["components"]["schemas"]["ChatRequest"]
    assert schema["additionalProperties"] is False and "messages" in schema["required"]


BAD_REQUESTS = [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", '{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -3}, 400, "top_k"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "frequency_penalty": 9}, 400, "frequency_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "bogus_field": 1}, 400, "bogus_field"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 5000}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [99999999]}, 400, "prompt"),
    ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, 404, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     400, "top_logprobs"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}, 400, "messages"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, 400, "prompt"),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    response = _post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_huge_prompt_says_context_length(server):
    error = _post(server, "/v1/completions", {"model": MODEL, "prompt": "word " * 5000}).json()["error"]
    assert error["code"] == "context_length_exceeded" and "context window is 4096" in error["message"]


def test_unknown_route_is_404_in_openai_shape(server):
    response = httpx.get(server.url + "/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_client_disconnect_cancels_generation(server):
    def metrics():
        text = httpx.get(server.url + "/metrics").text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

    before = metrics()
    body = {"model": MODEL, "prompt": "Go on and on", "max_tokens": 3000, "stream": True, "temperature": 1.0,
            "logit_bias": {"50256": -100}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: {") for line in received)
    deadline = time.monotonic() + 10
    while metrics()["nexttok_cancelled_total"] == before["nexttok_cancelled_total"]:
        assert time.monotonic() < deadline, "generation was not cancelled"
        time.sleep(0.05)
    after = metrics()
    assert after["nexttok_running"] == 0
    generated = after["nexttok_tokens_generated_total"] - before["nexttok_tokens_generated_total"]
    assert generated < 3000
    time.sleep(0.3)
    assert metrics()["nexttok_tokens_generated_total"] == after["nexttok_tokens_generated_total"]  # stopped


def test_api_key(served):
    with LiveServer(create_app([served], api_key=KEY)) as live:
        good = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2
        bad = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.get(live.url + "/v1/models").status_code == 401
        assert httpx.get(live.url + "/health").status_code == 200

