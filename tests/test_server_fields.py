"""The server with what real clients send: prompt scoring (echo + logprobs, max_tokens 0) as
evaluation harnesses use it, best_of, suffix, every field OpenAI documents for the routes served,
the deprecated functions, and tool calls that never leak the reply format. Through the official
`openai` client; the reference for scores is HF transformers' own logits of the same checkpoint."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from live_server import LiveServer
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.server import create_app, load_served

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CITY = {"name": "pick_city", "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                                            "properties": {"city": {"enum": ["Paris", "Rome"]}}}}


@pytest.fixture(scope="module")
def hf_logprobs(chat_model_dir):
    """log_softmax of HF transformers' logits for a list of ids: (T, vocab)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_model_dir, torch_dtype=torch.float32).eval()

    def of(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return of


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def test_echo_scores_every_prompt_token_as_the_model_does(client, served, hf_logprobs):
    result = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=3, max_tokens=0)
    choice, ids = result.choices[0], served.tokenizer.encode(PROMPT, add_special=True)
    reference = hf_logprobs(ids)
    lp = choice.logprobs
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert lp.tokens == [p.text for p in served.tokenizer.pieces(ids)]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing comes before it
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(reference[i - 1, ids[i]]), abs=1e-4)
        top = torch.topk(reference[i - 1], 3)
        assert list(lp.top_logprobs[i].values()) == pytest.approx(top.values.tolist(), abs=1e-4)
        assert list(lp.top_logprobs[i]) == [p.text for p in served.tokenizer.pieces(top.indices.tolist())]
    assert lp.text_offset == [len(served.tokenizer.decode(ids[:i])) for i in range(len(ids))]
    assert result.usage.prompt_tokens == len(ids) and result.usage.completion_tokens == 0


def test_echo_with_a_completion_is_the_prompt_then_the_same_completion(client, served):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1)
    plain = client.completions.create(**args).choices[0]
    echoed = client.completions.create(**args, echo=True).choices[0]
    scored = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0).choices[0]
    n = len(served.tokenizer.encode(PROMPT, add_special=True))
    assert echoed.text == PROMPT + plain.text
    assert echoed.logprobs.token_logprobs[:n] == pytest.approx(scored.logprobs.token_logprobs, abs=1e-5)
    assert echoed.logprobs.token_logprobs[n:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    assert echoed.logprobs.text_offset[n:] == [len(PROMPT) + o for o in plain.logprobs.text_offset]
    streamed = list(client.completions.create(**args, echo=True, stream=True))
    assert streamed[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in streamed) == echoed.text
    offsets = [o for c in streamed for o in c.choices[0].logprobs.text_offset]
    assert offsets == echoed.logprobs.text_offset


def test_echo_of_token_ids_and_of_a_batch_and_without_logprobs(client, served):
    ids = served.tokenizer.encode("Hello world, again")
    result = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=0, max_tokens=0)
    assert result.choices[0].text == served.tokenizer.decode(ids) and len(result.choices[0].logprobs.tokens) == len(ids)
    batch = client.completions.create(model=MODEL, prompt=["One", "Two three"], echo=True, max_tokens=2,
                                      temperature=0, n=2)
    assert [c.text[:3] for c in sorted(batch.choices, key=lambda c: c.index)] == ["One", "One", "Two", "Two"]
    assert all(c.logprobs is None for c in batch.choices)
    bare = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert bare.choices[0].text == "" and bare.choices[0].finish_reason == "length"
    assert bare.usage.completion_tokens == 0


def test_vllm_prompt_logprobs_give_rank_and_alternatives(server, served, hf_logprobs):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    choice = _post(server, "/v1/completions", body).json()["choices"][0]
    ids = served.tokenizer.encode(PROMPT, add_special=True)
    reference, entries = hf_logprobs(ids), choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None and not choice["text"].startswith(PROMPT)
    for i in range(1, len(ids)):
        own = entries[i][str(ids[i])]
        assert own["logprob"] == pytest.approx(float(reference[i - 1, ids[i]]), abs=1e-4)
        assert own["rank"] == int((reference[i - 1] > reference[i - 1, ids[i]]).sum()) + 1
        top = torch.topk(reference[i - 1], 2).indices.tolist()
        assert set(entries[i]) == {str(ids[i]), *map(str, top)}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert json.loads(lines[0][6:])["choices"][0]["prompt_logprobs"] == entries


def test_scoring_with_the_prefix_cache_on_is_the_same(chat_model_dir, client):
    from nexttok.server.limits import ServerLimits

    long = " ".join(["word"] * 300)
    expected = client.completions.create(model=MODEL, prompt=long, echo=True, logprobs=1, max_tokens=0)
    cached = load_served(str(chat_model_dir), MODEL)
    with LiveServer(create_app([cached], limits=ServerLimits(prefix_cache_tokens=1024))) as live:
        other = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        for _ in range(2):  # the second one finds the prompt's blocks in the prefix cache
            again = other.completions.create(model=MODEL, prompt=long, echo=True, logprobs=1, max_tokens=0)
            assert again.choices[0].logprobs.token_logprobs == expected.choices[0].logprobs.token_logprobs


def test_best_of_returns_the_candidate_with_the_best_mean_logprob(client, served):
    result = client.completions.create(model=MODEL, prompt="Once", max_tokens=8, temperature=1.0, seed=4,
                                       best_of=3, n=1)
    candidates = [generate(served.model, served.tokenizer, "Once", SamplingParams(temperature=1.0, seed=4 + k),
                           max_tokens=8) for k in range(3)]
    best = max(candidates, key=lambda c: sum(s.logprob for s in c.steps) / len(c.steps))
    assert result.choices[0].text == best.text and result.choices[0].index == 0
    assert result.usage.completion_tokens == sum(c.completion_tokens for c in candidates)


def test_fill_in_the_middle_prompt_is_the_models_own_form(trained_json):
    import tokenizers

    from nexttok.server.scoring import fim_ids
    from nexttok.tokenizers.from_json import tokenizer_from_json

    names = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    reference = tokenizers.Tokenizer.from_str(json.dumps(trained_json))
    reference.add_special_tokens(names)
    ours = tokenizer_from_json(json.loads(reference.to_str()), "fim tokenizer")
    text = "<|fim_prefix|>def add(a, b):<|fim_suffix|>    return c\n<|fim_middle|>"
    assert fim_ids(ours, "def add(a, b):", "    return c\n") == reference.encode(text).ids


BAD = [
    ({"prompt": "x", "suffix": "y"}, "suffix"),  # the test model has no fill-in-the-middle tokens
    ({"prompt": "x", "best_of": 1, "n": 2}, "best_of"),
    ({"prompt": "x", "best_of": 3, "stream": True}, "best_of"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "stop": ""}, "stop"),
    ({"prompt": "x", "stop": ["ok", ""]}, "stop"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_completion_fields_name_themselves(server, body, param):
    response = _post(server, "/v1/completions", {"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# A valid value of every request field OpenAI documents, per route (the openai package's own
# TypedDicts are the list: a field added there fails test_every_documented_field_is_known).
COMPLETION_FIELDS = {
    "model": MODEL, "prompt": "Hi", "best_of": 2, "echo": True, "frequency_penalty": 0.1,
    "logit_bias": {"50256": -5}, "logprobs": 1, "max_tokens": 2, "n": 1, "presence_penalty": 0.1, "seed": 3,
    "stop": ["\n\n"], "stream": False, "stream_options": None, "suffix": None, "temperature": 0.7, "top_p": 0.9,
    "user": "someone",
}
CHAT_FIELDS = {
    "model": MODEL, "messages": ASK, "audio": None, "frequency_penalty": 0.1, "function_call": "auto",
    "functions": [WEATHER["function"]], "logit_bias": {"50256": -5}, "logprobs": True, "max_completion_tokens": 3,
    "max_tokens": 3, "metadata": {"run": "42"}, "modalities": ["text"], "moderation": None, "n": 1,
    "parallel_tool_calls": False, "prediction": {"type": "content", "content": "Sunny"}, "presence_penalty": 0.1,
    "prompt_cache_key": "k", "prompt_cache_options": {}, "prompt_cache_retention": "in_memory",
    "reasoning_effort": "low", "response_format": {"type": "text"}, "safety_identifier": "u1", "seed": 1,
    "service_tier": "auto", "stop": "\n\n", "store": False, "stream": False, "stream_options": None,
    "temperature": 0.5, "tool_choice": "auto", "tools": [WEATHER], "top_logprobs": 2, "top_p": 0.9,
    "user": "someone", "verbosity": "low", "web_search_options": {},
}
def _documented(params_module) -> set[str]:
    """The request fields of one route in the openai package (stream is in its subclasses)."""
    return set(params_module.CompletionCreateParamsBase.__annotations__) | {"stream"}


def test_every_documented_field_is_known():
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params

    assert _documented(completion_create_params) == set(COMPLETION_FIELDS)
    assert _documented(chat_params) == set(CHAT_FIELDS)


@pytest.mark.parametrize(("path", "fields"), [("/v1/completions", COMPLETION_FIELDS),
                                              ("/v1/chat/completions", CHAT_FIELDS)])
def test_every_documented_field_is_accepted(server, path, fields):
    required = {"model", "prompt", "messages"}
    for name, value in fields.items():
        body = {k: v for k, v in fields.items() if k in required}
        body[name] = value
        if name == "function_call":
            body["functions"] = fields["functions"]
        if name in ("tool_choice", "parallel_tool_calls"):
            body["tools"] = fields["tools"]
        if name == "top_logprobs":
            body["logprobs"] = True
        response = _post(server, path, {**body, "max_tokens": 2} if "max_tokens" not in body else body)
        assert response.status_code == 200, f"{name}: {response.text}"
    every = {k: v for k, v in fields.items() if k not in ("functions", "function_call")}  # tools instead
    assert _post(server, path, every).status_code == 200, "all fields at once"
    unknown = _post(server, path, {**{k: fields[k] for k in required & set(fields)}, "bogus_field": 1})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "bogus_field"


@pytest.mark.parametrize(("field", "value"), [("audio", {"voice": "alloy", "format": "wav"}),
                                               ("modalities", ["text", "audio"])])
def test_audio_output_is_refused_not_dropped(server, field, value):
    response = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": ASK, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field


def test_deprecated_functions_answer_with_function_call(client):
    result = client.chat.completions.create(model=MODEL, messages=ASK, functions=[CITY],
                                            function_call={"name": "pick_city"}, max_tokens=60, temperature=0)
    choice = result.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call.name == "pick_city"
    assert json.loads(choice.message.function_call.arguments)["city"] in ("Paris", "Rome")
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, functions=[CITY], stream=True,
                                                 function_call={"name": "pick_city"}, max_tokens=60, temperature=0))
    pieces = [c.choices[0].delta.function_call for c in chunks if c.choices and c.choices[0].delta.function_call]
    assert pieces[0].name == "pick_city" and len(pieces) > 1  # the arguments in pieces, as generated
    assert "".join(p.arguments or "" for p in pieces) == choice.message.function_call.arguments
    assert chunks[-1].choices[0].finish_reason == "function_call"


def test_one_tool_call_unless_parallel_is_asked_for(client):
    counts = {}
    for parallel in (None, True):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        for seed in range(6):
            result = client.chat.completions.create(model=MODEL, messages=ASK, tools=[{"type": "function",
                                                    "function": CITY}], tool_choice="required", max_tokens=300,
                                                    temperature=1.5, seed=seed, **extra)
            assert result.choices[0].finish_reason == "tool_calls"
            counts.setdefault(parallel, []).append(len(result.choices[0].message.tool_calls))
    assert counts[None] == [1] * 6
    assert max(counts[True]) > 1, counts  # the same seeds do call more than once when allowed


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_cut_inside_a_call_is_length_and_never_its_json(client, stream):
    args = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=5, temperature=0)
    if stream:
        chunks = list(client.chat.completions.create(**args, stream=True))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    else:
        choice = client.chat.completions.create(**args).choices[0]
        finish, text, calls = [choice.finish_reason], choice.message.content or "", choice.message.tool_calls
    assert finish == ["length"] and not calls
    assert "tool_calls" not in text and "{" not in text


def test_the_library_and_the_server_prefill_a_long_prompt_the_same_way():
    """One chunked prefill for both paths: past one chunk (128 tokens) the first token's logits are
    the same bits on the default model (its block kernels round 8-bit activations where they fall,
    so a prompt run in one call instead would differ by tenths of a logit)."""
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.loop import Generation, generate_step
    from nexttok.models.slot_cache import SlotCache
    from nexttok.server.prefix_cache import prefill

    checkpoint = load_checkpoint("default")
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    ids = tokenizer.encode(" ".join(f"word{i}" for i in range(150)))
    assert len(ids) > 256
    cache = SlotCache.for_model(model.config, slots=1, max_len=len(ids) + 8)
    with torch.inference_mode():
        served = prefill(model, cache, cache.claim(), ids, None)
    generation = Generation(model.config, tokenizer, ids, SamplingParams(temperature=0), max_tokens=1, top_n=0)
    step = next(generate_step(model, generation))
    assert step.logprob == float(torch.log_softmax(served.float(), -1)[step.token_id])
    assert step.token_id == int(served.argmax())
