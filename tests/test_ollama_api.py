"""Ollama's native API through Ollama's own Python client, unchanged, against a live server: chat
and generate (streamed and not), format, options, tools, logprobs, embed and embeddings, the model
routes, errors and the API key. Each answer is checked against the route that already had it: the
OpenAI routes, called with the openai client, for the same model and input."""

from __future__ import annotations

import dataclasses
import json
from importlib import metadata

import httpx
import jsonschema
import pytest

from json_schemas import SCHEMAS
from live_server import LiveServer
from nexttok.generation.loop import Step
from nexttok.server import create_app
from nexttok.server.ollama_wire import OllamaWire

ollama = pytest.importorskip("ollama")

MODEL = "tiny"
GREEDY = {"temperature": 0}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def local(server):
    """Ollama's client, unchanged, pointed at the live server."""
    return ollama.Client(host=server.url)


def _openai_chat(client, messages, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kwargs)


def test_chat_streamed_and_whole_are_the_openai_routes_greedy_reply(local, client):
    whole = local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 12})
    parts = list(local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 12}, stream=True))
    direct = _openai_chat(client, MESSAGES, max_tokens=12)
    assert whole.message.role == "assistant" and whole.message.content == direct.choices[0].message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].message.content == ""
    for final in (whole, parts[-1]):
        assert final.done_reason == direct.choices[0].finish_reason
        assert final.prompt_eval_count == direct.usage.prompt_tokens
        assert final.eval_count == direct.usage.completion_tokens
        durations = (final.prompt_eval_duration, final.eval_duration, final.load_duration)
        assert all(isinstance(d, int) and d >= 0 for d in durations) and final.prompt_eval_duration > 0
        assert final.total_duration >= sum(durations)


def test_generate_raw_is_the_completions_route_and_templated_is_chat(local, client, served):
    raw = local.generate(model=MODEL, prompt="Once upon a time", raw=True, options={**GREEDY, "num_predict": 9})
    direct = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=9, temperature=0)
    assert raw.response == direct.choices[0].text and raw.prompt_eval_count == direct.usage.prompt_tokens
    assert raw.context is None  # as Ollama: raw mode returns no context
    templated = local.generate(model=MODEL, system="Be brief.", prompt="Tell me a story",
                               options={**GREEDY, "num_predict": 9})
    assert templated.response == _openai_chat(client, MESSAGES, max_tokens=9).choices[0].message.content
    prompt_ids = served.tokenizer.encode(served.chat_template.render(MESSAGES))
    assert templated.context[: len(prompt_ids)] == prompt_ids and templated.prompt_eval_count == len(prompt_ids)
    assert len(templated.context) == templated.prompt_eval_count + templated.eval_count
    streamed = list(local.generate(model=MODEL, system="Be brief.", prompt="Tell me a story", stream=True,
                                   options={**GREEDY, "num_predict": 9}))
    assert "".join(p.response for p in streamed) == templated.response and streamed[-1].context == templated.context


def test_format_schema_validates_and_json_is_the_json_object_grammar(local, client):
    name, prompt, schema = SCHEMAS[2]  # enums and a bounded integer
    for stream in (False, True):
        reply = local.chat(model=MODEL, messages=[{"role": "user", "content": prompt}], format=schema, stream=stream,
                           options={"temperature": 0.7, "seed": 3, "num_predict": 300})
        text = "".join(p.message.content for p in reply) if stream else reply.message.content
        jsonschema.validate(json.loads(text), schema)
    # format "json" is the grammar of OpenAI's json_object: the same text, an object from its first character
    options = {"temperature": 0.7, "seed": 5, "num_predict": 40}
    reply = local.generate(model=MODEL, prompt="Reply in JSON", raw=True, format="json", options=options)
    direct = client.completions.create(model=MODEL, prompt="Reply in JSON", max_tokens=40, temperature=0.7, seed=5,
                                       top_p=0.9, extra_body={"top_k": 40, "response_format": {"type": "json_object"}})
    assert reply.response == direct.choices[0].text and reply.response.startswith("{")


def test_num_predict_ends_at_length_with_that_many_tokens(local):
    for n in (1, 5):
        reply = local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": n})
        assert reply.done_reason == "length" and reply.eval_count == n
    whole = local.generate(model=MODEL, prompt="Count", raw=True, options={**GREEDY, "num_ctx": 12})
    assert whole.done_reason == "length" and whole.prompt_eval_count + whole.eval_count == 12  # num_ctx: the window


@pytest.mark.parametrize("option, value, openai_field", [
    (None, None, None), ("top_k", 3, "top_k"), ("top_p", 0.4, "top_p"), ("min_p", 0.95, "min_p"),
    ("temperature", 1.4, "temperature"), ("repeat_penalty", 1.5, "repetition_penalty"),
    ("presence_penalty", 1.5, "presence_penalty"), ("frequency_penalty", 1.5, "frequency_penalty"),
    ("typical_p", 0.3, "typical_p"), ("mirostat", 2, "mirostat")])
def test_each_sampling_option_is_the_openai_routes_parameter(local, client, option, value, openai_field):
    """Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9) and each option over them draw what
    the completions route draws with the same parameters and seed."""
    options = {"seed": 4, "num_predict": 12, **({option: value} if option else {})}
    ours = local.generate(model=MODEL, prompt="Once upon a time", raw=True, options=options).response
    dials = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, **({openai_field: value} if option else {})}
    theirs = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, seed=4,
                                       temperature=dials.pop("temperature"), top_p=dials.pop("top_p"),
                                       extra_body=dials).choices[0].text
    assert ours == theirs
    if option is not None:  # and the option changed the draw
        assert ours != local.generate(model=MODEL, prompt="Once upon a time", raw=True,
                                      options={"seed": 4, "num_predict": 12}).response


def test_repeat_last_n_zero_switches_the_penalties_off(local):
    def reply(**extra):
        return local.generate(model=MODEL, prompt="Once upon a time", raw=True,
                              options={"seed": 4, "num_predict": 12, **extra}).response
    assert reply(repeat_penalty=1.5, repeat_last_n=0) == reply() != reply(repeat_penalty=1.5)
    assert reply(repeat_penalty=1.5, repeat_last_n=-1) == reply(repeat_penalty=1.5)
    assert reply(repeat_penalty=1.5, repeat_last_n=2) != reply(repeat_penalty=1.5)  # a window of its own


def test_stop_ends_the_reply_before_the_stop_text(local):
    full = local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 20}).message.content
    stop = full.split()[-1]
    reply = local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 20, "stop": ["zzz", stop]})
    assert reply.message.content == full[: full.index(stop)] and reply.done_reason == "stop"


def test_seed_reproduces_a_sampled_reply(local):
    def sampled(seed):
        return local.chat(model=MODEL, messages=MESSAGES, options={"temperature": 1.5, "seed": seed,
                                                                   "num_predict": 16}).message.content
    assert sampled(11) == sampled(11)
    assert len({sampled(seed) for seed in (1, 2, 3)}) > 1


def test_every_option_of_the_client_is_honoured_ignored_or_refused_by_name(server):
    """Walks the client's own Options type: an option it can send is either taken (what it does is in
    the README's table) or refused in one line naming it."""
    refused = {"tfs_z": 0.5}
    values = {int: 1, float: 1.0, bool: False}
    for name, field in ollama.Options.model_fields.items():
        kind = next((k for k in values if k.__name__ in str(field.annotation)), None)
        value = {"stop": ["zz"], "num_ctx": 64}.get(name, refused.get(name, values.get(kind, 1)))
        response = httpx.post(server.url + "/api/generate", json={
            "model": MODEL, "prompt": "x", "raw": True, "stream": False,
            "options": {"num_predict": 1, name: value} if name != "num_predict" else {name: 1}}, timeout=60)
        if name in refused:
            assert response.status_code == 400 and f"options.{name}" in response.json()["error"], response.text
            assert "\n" not in response.json()["error"]
        else:
            assert response.status_code == 200, (name, response.text)
    ignored = {"num_gpu": 3, "num_thread": 2, "use_mmap": True, "num_keep": 7, "penalize_newline": True}
    plain = httpx.post(server.url + "/api/generate", json={"model": MODEL, "prompt": "Count", "raw": True,
                                                          "stream": False, "options": {**GREEDY, "num_predict": 6}})
    with_ignored = httpx.post(server.url + "/api/generate", json={
        "model": MODEL, "prompt": "Count", "raw": True, "stream": False,
        "options": {**GREEDY, "num_predict": 6, **ignored}})
    assert with_ignored.json()["response"] == plain.json()["response"]


@pytest.mark.parametrize("options, named", [
    ({"temperature": "hot"}, "options.temperature"), ({"num_predict": 2.5}, "options.num_predict"),
    ({"top_p": 0}, "options.top_p"), ({"stop": "x"}, "options.stop"), ({"bogus": 1}, "options.bogus"),
    ({"mirostat": 3}, "options.mirostat"), ({"num_ctx": 4}, "num_ctx"),
    ({"stop": ["zz"] * 40}, "options.stop")])
def test_bad_options_are_a_400_in_one_line_naming_the_option(local, options, named):
    with pytest.raises(ollama.ResponseError) as caught:
        local.chat(model=MODEL, messages=MESSAGES, options=options)
    assert caught.value.status_code == 400 and named in caught.value.error and "\n" not in caught.value.error
    assert len(caught.value.error) < 200  # a long value is cut short


def test_a_tool_call_comes_back_with_its_arguments_as_an_object(local, served):
    # a random model: at this seed its reply is a call (at others, text: tool_choice is "auto" in Ollama)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER],
               options={"temperature": 1, "seed": 2, "num_predict": 60})
    reply = local.chat(**ask)
    parts = list(local.chat(**ask, stream=True))
    streamed = [call for p in parts if p.message.tool_calls for call in p.message.tool_calls]
    assert len(reply.message.tool_calls) == 1 and reply.message.content == "" and reply.done_reason == "stop"
    for call in (reply.message.tool_calls[0], streamed[0]):
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
        jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    assert streamed == list(reply.message.tool_calls) and parts[-1].done
    history = [*ask["messages"], reply.message, {"role": "tool", "content": "11 degrees", "tool_name": "get_weather"}]
    answer = local.chat(model=MODEL, messages=history, tools=[WEATHER], options={**GREEDY, "num_predict": 4})
    assert answer.done and answer.prompt_eval_count > reply.prompt_eval_count


def test_a_text_reply_to_tools_streams_as_it_is_generated(local):
    # at this seed the random model answers with text: it streams a piece a step, never the reply's JSON
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER],
               options={"temperature": 1, "seed": 0, "num_predict": 60})
    whole = local.chat(**ask)
    parts = list(local.chat(**ask, stream=True))
    assert whole.message.tool_calls is None and whole.message.content and not whole.message.content.startswith("{")
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert len([p for p in parts if p.message.content]) > 10 and not any(p.message.tool_calls for p in parts)
    assert parts[-1].done_reason == whole.done_reason == "length"


def test_logprobs_are_the_openai_routes(local, client):
    reply = local.chat(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3,
                       options={**GREEDY, "num_predict": 5})
    direct = _openai_chat(client, MESSAGES, max_tokens=5, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    assert len(reply.logprobs) == reply.eval_count == len(direct)
    for ours, theirs in zip(reply.logprobs, direct, strict=True):
        assert ours.token == theirs.token and ours.logprob == pytest.approx(theirs.logprob, abs=1e-6)
        assert [t.token for t in ours.top_logprobs] == [t.token for t in theirs.top_logprobs]
    assert local.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 2}).logprobs is None


def test_embed_and_embeddings_are_the_openai_routes_vectors(local, client):
    texts = ["a king", "a queen"]
    ours = local.embed(model=MODEL, input=texts)
    theirs = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [list(v) for v in ours.embeddings] == [d.embedding for d in theirs.data]
    assert ours.prompt_eval_count == theirs.usage.prompt_tokens
    assert list(local.embed(model=MODEL, input="a king").embeddings[0]) == theirs.data[0].embedding
    assert list(local.embeddings(model=MODEL, prompt="a king").embedding) == theirs.data[0].embedding
    assert list(local.embed(model=MODEL, input="").embeddings) == []


def test_embed_truncates_to_the_context_unless_told_not_to(local, client, served):
    long = "word " * (served.context_length + 50)
    ids = served.tokenizer.encode(long, add_special=True)[: served.context_length]
    cut = local.embed(model=MODEL, input=long).embeddings[0]
    assert list(cut) == client.embeddings.create(model=MODEL, input=ids, encoding_format="float").data[0].embedding
    with pytest.raises(ollama.ResponseError) as caught:
        local.embed(model=MODEL, input=long, truncate=False)
    assert caught.value.status_code == 400 and "context window" in caught.value.error


def test_list_show_ps_and_version(local, server, served):
    listed = local.list().models
    assert [m.model for m in listed] == ["tiny:latest"] and listed[0].details.family == "llama"
    assert listed[0].size > 0 and len(listed[0].digest) == 64 and listed[0].details.format == "safetensors"
    shown = local.show("tiny:latest")
    assert shown == local.show(MODEL) and shown.template == served.chat_template.source
    assert set(shown.capabilities) == {"completion", "tools", "embedding"}
    info = shown.modelinfo
    assert info["general.architecture"] == "llama" and info["llama.context_length"] == 4096
    assert info["llama.embedding_length"] == served.model.config.hidden_size
    assert "num_ctx" in shown.parameters and shown.details == listed[0].details
    running = local.ps().models
    assert [m.model for m in running] == ["tiny:latest"] and running[0].size > 0
    assert running[0].context_length == served.context_length and running[0].expires_at.year > 2100
    assert httpx.get(server.url + "/api/version").json() == {"version": metadata.version("nexttok"), "engine": "nexttok"}
    assert local.chat(model="tiny:latest", messages=MESSAGES, options={**GREEDY, "num_predict": 3}).done


def test_loading_and_keep_alive(local):
    assert local.generate(model=MODEL).done_reason == "load"
    assert local.chat(model=MODEL, messages=[], keep_alive="5m").done_reason == "load"
    assert local.chat(model=MODEL, messages=MESSAGES, keep_alive=0, think=False,
                      options={**GREEDY, "num_predict": 2}).eval_count == 2


@pytest.mark.parametrize("call", [
    lambda c: c.chat(model="nope", messages=MESSAGES), lambda c: list(c.chat(model="nope", messages=MESSAGES,
                                                                             stream=True)),
    lambda c: c.generate(model="nope", prompt="x"), lambda c: c.embed(model="nope", input="x"),
    lambda c: c.embeddings(model="nope", prompt="x"), lambda c: c.show("nope")])
def test_an_unknown_model_is_a_404_with_our_message(local, call):
    with pytest.raises(ollama.ResponseError) as caught:
        call(local)
    assert caught.value.status_code == 404
    assert caught.value.error.startswith("model 'nope' not found; this server runs tiny:latest")


@pytest.mark.parametrize("call, status, says", [
    (lambda c: c.chat(model=MODEL, messages=MESSAGES, think=True), 400, "does not support thinking"),
    (lambda c: c.generate(model=MODEL, prompt="x", think="high"), 400, "does not support thinking"),
    (lambda c: c.generate(model=MODEL, prompt="x", template="{{ .Prompt }}"), 400, "template"),
    (lambda c: c.generate(model=MODEL, prompt="x", raw=True, system="s"), 400, "raw mode"),
    (lambda c: c.generate(model=MODEL, prompt="x", suffix="y"), 400, "fill-in-the-middle"),
    (lambda c: c.generate(model=MODEL, prompt="x", suffix="y", system="s"), 400, "system cannot be combined"),
    (lambda c: c.chat(model=MODEL, messages=MESSAGES, tools=[WEATHER], format="json"), 400, "format"),
    (lambda c: c.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": [b"\x89PNG"]}]), 400,
     "images"),
    (lambda c: c.generate(model=MODEL, prompt="x", width=64, height=64), 400, "width: image generation"),
    (lambda c: c.generate(model=MODEL, prompt="x", context=[10**6]), 400, "context: token id 1000000 is outside"),
    (lambda c: c.pull("tiny"), 400, "'tiny' names no hub repository: pull hf.co/ORG/REPO[:QUANT]"),
    (lambda c: c.delete("tiny"), 404, "model 'tiny' not found"),
    (lambda c: c.copy("tiny", "other"), 404, "model 'tiny' not found"),
    (lambda c: c.push("tiny"), 501, "not available here; models come from the Hugging Face hub"),
    (lambda c: c.create("mine", from_="tiny"), 501, "not available here")])
def test_what_is_not_available_is_refused_by_name(local, call, status, says):
    with pytest.raises(ollama.ResponseError) as caught:
        call(local)
    assert caught.value.status_code == status and says in caught.value.error and "\n" not in caught.value.error


def test_a_model_without_a_chat_template_generates_its_prompt_as_is(served, local):
    plain = dataclasses.replace(served, name="plain", chat_template=None, scheduler=None)
    with LiveServer(create_app([plain])) as live:
        bare = ollama.Client(host=live.url)
        with pytest.raises(ollama.ResponseError) as caught:
            bare.chat(model="plain", messages=MESSAGES)
        assert caught.value.status_code == 400 and "no chat template; use /api/generate" in caught.value.error
        options = {**GREEDY, "num_predict": 6}
        reply = bare.generate(model="plain", prompt="Once upon a time", options=options)
        assert reply.response == local.generate(model=MODEL, prompt="Once upon a time", raw=True,
                                                options=options).response and reply.context is None
        assert bare.show("plain").capabilities == ["completion", "embedding"]


def test_errors_are_ollamas_shape_and_the_openai_routes_keep_theirs(server):
    for body in ("{not json", json.dumps({"model": MODEL, "messages": "x"}), json.dumps({"model": MODEL, "what": 1})):
        response = httpx.post(server.url + "/api/chat", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and list(response.json()) == ["error"], response.text
        assert isinstance(response.json()["error"], str)
    assert httpx.get(server.url + "/api/nothing").json() == {"error": "no route GET /api/nothing"}
    unnamed = httpx.post(server.url + "/api/show", json={})
    assert unnamed.status_code == 400 and unnamed.json() == {"error": "model is required"}  # Ollama's words
    openai_error = httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": MESSAGES})
    assert openai_error.status_code == 404 and openai_error.json()["error"]["code"] == "model_not_found"


def test_the_api_key_rule_is_the_same(served):
    with LiveServer(create_app([served], api_key="sk-ollama")) as live:
        good = ollama.Client(host=live.url, headers={"Authorization": "Bearer sk-ollama"})
        assert [m.model for m in good.list().models] == ["tiny:latest"]
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            with pytest.raises(ollama.ResponseError) as caught:
                ollama.Client(host=live.url, headers=headers).chat(model=MODEL, messages=MESSAGES)
            assert caught.value.status_code == 401 and "API key" in caught.value.error


def test_openapi_lists_the_routes_their_streams_and_errors(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    for path in ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/tags", "/api/show",
                 "/api/ps", "/api/version", "/api/pull"):
        assert path in spec["paths"], path
    chat = spec["paths"]["/api/chat"]["post"]["responses"]
    assert "application/x-ndjson" in chat["200"]["content"]
    assert chat["404"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/OllamaError"
    assert "429" not in chat and "waiting line" in chat["503"]["description"]  # Ollama's 503 for a full queue
    pull = spec["paths"]["/api/pull"]["post"]["responses"]
    assert "application/x-ndjson" in pull["200"]["content"]
    assert pull["502"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/OllamaError"
    push = spec["paths"]["/api/push"]["post"]["responses"]["501"]
    assert push["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/OllamaError"


def test_the_durations_add_up_when_the_first_step_reaches_the_request_late():
    """The scheduler may have made later steps before the first one reaches the request: the parts
    (load, prompt eval, eval) must still fit in the total, and load is what is left of it."""
    steps = [Step(i, 0, "a", "a", None, None, [], [], None, 0.004 if i == 0 else 0.008, i == 0) for i in range(4)]
    wire = OllamaWire(model=MODEL, tokenizer=None, prompt_ids=[1, 2], chat=True)
    wire.arrived -= 0.050  # arrived 50 ms ago; the first step reached it 35 ms after that, when
    wire.first_at = wire.arrived + 0.035  # some of the three 8 ms steps after it had already run
    final = wire.final(steps)
    parts = final["load_duration"] + final["prompt_eval_duration"] + final["eval_duration"]
    assert final["prompt_eval_duration"] == 4_000_000 and final["eval_duration"] == 24_000_000
    # 31 ms as the first step's arrival puts it, at most what the steps leave of the total (~22 ms)
    assert final["load_duration"] == min(31_000_000, final["total_duration"] - 28_000_000)
    assert parts <= final["total_duration"]
