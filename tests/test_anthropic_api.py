"""POST /v1/messages and /v1/messages/count_tokens through the official `anthropic` client,
unchanged: the same generation as the chat route for the same conversation, Anthropic's response
shape and stop reasons, its event stream (text and tool_use), tools and their results, token
counts, errors in Anthropic's shape, and the API key sent as x-api-key.

The SDK (2.x) no longer takes temperature / top_p / top_k as arguments; the API still does, so
they go in extra_body, as a client of a server that reads them sends them."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

anthropic = pytest.importorskip("anthropic")

MODEL = "tiny"
KEY = "sk-anthropic-test"
CITY = {"type": "object", "required": ["city"], "additionalProperties": False,
        "properties": {"city": {"enum": ["Paris", "Rome"]}}}
TOOL = {"name": "pick_city", "description": "Pick a city", "input_schema": CITY}
OTHER_TOOL = {"name": "pick_day", "description": "Pick a day", "input_schema": {
    "type": "object", "required": ["day"], "additionalProperties": False, "properties": {"day": {"enum": ["Mon", "Tue"]}}}}
GREEDY = {"temperature": 0}
STORY = [{"role": "user", "content": "Tell me a story"}]
MESSAGE_KEYS = {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}


@pytest.fixture(scope="module")
def claude(server):
    """The official anthropic client, unchanged, pointed at the live server."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def _create(claude, messages=STORY, max_tokens=12, **kwargs):
    return claude.messages.create(model=MODEL, messages=messages, max_tokens=max_tokens, extra_body=GREEDY, **kwargs)


def _chat(client, messages, **kwargs):
    """The chat route's greedy answer to the same conversation (OpenAI's client)."""
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kwargs)


def _text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_is_the_chat_routes_greedy_text(claude, client, server):
    reply = _create(claude, system="Be brief.")
    chat = _chat(client, [{"role": "system", "content": "Be brief."}, *STORY], max_tokens=12)
    assert _text(reply) == chat.choices[0].message.content
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == MODEL and [block.type for block in reply.content] == ["text"]
    assert reply.stop_reason == "max_tokens" and reply.stop_sequence is None
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens == 12
    raw = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "messages": STORY, "max_tokens": 3},
                     timeout=60).json()
    assert set(raw) == MESSAGE_KEYS and set(raw["usage"]) == {"input_tokens", "output_tokens"}


def test_system_blocks_and_a_multi_turn_conversation(claude, client):
    turns = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Hi! How can I help?"}]},
             {"role": "user", "content": "Tell me a story"}]
    system = [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]
    reply = _create(claude, turns, max_tokens=8, system=system)
    chat = _chat(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"},
                          {"role": "assistant", "content": "Hi! How can I help?"}, STORY[0]], max_tokens=8)
    assert _text(reply) == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens


def test_stop_sequences_end_the_text_and_are_named(claude):
    whole = _text(_create(claude, max_tokens=20))
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    assert stop.strip(), whole
    reply = _create(claude, max_tokens=20, stop_sequences=["never-in-gpt2-text", stop])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert _text(reply) == whole[:whole.find(stop)]


def test_a_reply_that_ends_itself_is_end_turn_and_output_config_is_honoured(claude):
    schema = {"type": "object", "required": ["city"], "additionalProperties": False,
              "properties": {"city": {"enum": ["Paris", "Rome"]}}}
    reply = _create(claude, max_tokens=40, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    jsonschema.validate(json.loads(_text(reply)), schema)


def test_stream_text_is_the_created_text(claude):
    reply = _create(claude, max_tokens=10, system="Be brief.")
    with claude.messages.stream(model=MODEL, messages=STORY, max_tokens=10, system="Be brief.",
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == _text(reply) == _text(final)
    assert final.usage.input_tokens == reply.usage.input_tokens and final.usage.output_tokens == 10
    assert final.stop_reason == "max_tokens" and final.id.startswith("msg_")


def _events(server, body: dict) -> list[tuple[str, dict]]:
    """(event line, data) of each event of a raw stream."""
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True}, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_stream_events_come_in_anthropics_order(server):
    events = _events(server, {"model": MODEL, "messages": STORY, "max_tokens": 5, "temperature": 0})
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names == ["message_start", "ping", "content_block_start", *["content_block_delta"] * (len(names) - 6),
                     "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert set(start) == MESSAGE_KEYS
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 5


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "pick_city"}])
def test_tool_choice_forces_a_tool_use_that_fits_its_schema(claude, choice):
    reply = _create(claude, [{"role": "user", "content": "Weather in Paris?"}], max_tokens=60,
                    tools=[OTHER_TOOL, TOOL] if choice["type"] == "tool" else [TOOL], tool_choice=choice)
    assert reply.stop_reason == "tool_use" and [block.type for block in reply.content] == ["tool_use"]
    call = reply.content[0]
    assert call.id.startswith("toolu_") and call.name == "pick_city"
    jsonschema.validate(call.input, CITY)


def test_a_tool_result_continues_the_conversation_as_on_the_chat_route(claude, client):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    call = _create(claude, ask, max_tokens=60, tools=[TOOL], tool_choice={"type": "any"}).content[0]
    turns = [*ask, {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                                      "input": call.input}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"},
                                          {"type": "text", "text": "Thanks"}]}]
    reply = _create(claude, turns, max_tokens=8)
    chat = _chat(client, [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"}, {"role": "user", "content": "Thanks"}],
        max_tokens=8)
    assert _text(reply) == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens


def _stream_args(messages, **kwargs):
    return dict(model=MODEL, messages=messages, extra_body=GREEDY, **kwargs)


def _raw(args: dict) -> dict:
    """A request of the SDK's arguments as a raw body."""
    return {**{k: v for k, v in args.items() if k != "extra_body"}, **args["extra_body"]}


def _blocks(events) -> list[tuple[int, str, str]]:
    """(index, type, its deltas joined) of each content block of a raw stream, checking that blocks
    never overlap and come at indexes 0, 1, 2, ..."""
    blocks, open_at = [], None
    for name, data in events:
        if name == "content_block_start":
            assert open_at is None and data["index"] == len(blocks)
            open_at = data["index"]
            blocks.append([open_at, data["content_block"]["type"], ""])
        elif name == "content_block_delta":
            assert data["index"] == open_at
            blocks[-1][2] += data["delta"].get("text", data["delta"].get("partial_json"))
        elif name == "content_block_stop":
            assert data["index"] == open_at
            open_at = None
    assert open_at is None
    return [tuple(block) for block in blocks]


def test_streamed_tool_use_comes_as_it_is_generated_and_is_the_created_one(claude, server):
    args = _stream_args([{"role": "user", "content": "Weather in Rome?"}], max_tokens=60, tools=[TOOL],
                        tool_choice={"type": "any"})
    created = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        deltas = [event.partial_json for event in stream if event.type == "input_json"]
        final = stream.get_final_message()
    # the input's JSON in pieces as the model writes it; joined, the non-streamed input
    assert len(deltas) > 1 and json.loads("".join(deltas)) == created.content[0].input
    assert [(b.type, b.name, b.input) for b in final.content] == [(b.type, b.name, b.input) for b in created.content]
    assert final.stop_reason == created.stop_reason == "tool_use"
    assert final.usage.output_tokens == created.usage.output_tokens
    events = _events(server, _raw(args))
    names = [name for name, _ in events]
    assert names == ["message_start", "ping", "content_block_start", *["content_block_delta"] * (len(names) - 6),
                     "content_block_stop", "message_delta", "message_stop"]
    assert events[2][1]["content_block"]["input"] == {} and events[2][1]["content_block"]["id"].startswith("toolu_")
    assert {data["delta"]["type"] for _, data in events[3:-3]} == {"input_json_delta"}
    assert _blocks(events) == [(0, "tool_use", "".join(deltas))]


def test_text_a_tool_reply_writes_instead_of_a_call_streams_as_text(claude, server):
    """tool_choice auto: the tiny model answers in text ({"response": ...} in the tools' format),
    which streams as a text block; the format has no reply with both text and calls."""
    args = _stream_args(STORY, max_tokens=12, tools=[TOOL], tool_choice={"type": "auto"})
    created = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert [block.type for block in created.content] == ["text"] and len(pieces) > 1
    assert "".join(pieces) == _text(created) == _text(final) and "response" not in _text(created)
    assert final.stop_reason == created.stop_reason == "max_tokens"
    assert _blocks(_events(server, _raw(args))) == [(0, "text", _text(created))]


def test_parallel_calls_stream_one_block_each_and_a_cut_call_ends_cleanly(claude, server):
    """Several calls (disable_parallel_tool_use: false) cut by max_tokens: a tool_use block each, at
    consecutive indexes; the cut one stops where it was cut (its pieces no whole JSON, as Anthropic's
    fine-grained tool streaming), stop_reason max_tokens; the non-streamed message has the calls
    written whole and leaves out the cut one."""
    args = _stream_args([{"role": "user", "content": "Weather in Rome?"}], max_tokens=80, tools=[TOOL],
                        tool_choice={"type": "any", "disable_parallel_tool_use": False})
    created = claude.messages.create(**args)
    events = _events(server, _raw(args))
    blocks = _blocks(events)
    assert len(blocks) > 2 and {kind for _, kind, _ in blocks} == {"tool_use"}
    whole, (_, _, cut) = blocks[:-1], blocks[-1]
    assert [json.loads(text) for _, _, text in whole] == [block.input for block in created.content]
    with pytest.raises(ValueError):
        json.loads(cut)
    assert events[-2][1]["delta"]["stop_reason"] == created.stop_reason == "max_tokens"
    with claude.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and len(final.content) == len(blocks)
    assert [b.input for b in final.content[:-1]] == [b.input for b in created.content]


def test_a_single_call_cut_by_max_tokens_is_no_block_when_not_streamed(claude, server):
    ask = [{"role": "user", "content": "Weather in Rome?"}]
    whole = _events(server, _raw(_stream_args(ask, max_tokens=60, tools=[TOOL], tool_choice={"type": "any"})))
    total = whole[-2][1]["usage"]["output_tokens"]
    args = _stream_args(ask, max_tokens=total - 5, tools=[TOOL], tool_choice={"type": "any"})  # inside its input
    created = claude.messages.create(**args)
    assert created.content == [] and created.stop_reason == "max_tokens"
    events = _events(server, _raw(args))
    ((_, kind, cut),) = _blocks(events)
    assert kind == "tool_use" and cut and _blocks(whole)[0][2].startswith(cut)
    with pytest.raises(ValueError):
        json.loads(cut)
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def _steps(pieces: list[str], finish: str) -> list:
    from nexttok.generation.loop import Step

    return [Step(i, 0, text, text, 0.0, 1, [], [], None, 0.0, i == 0, finish if i == len(pieces) - 1 else None)
            for i, text in enumerate(pieces)]


@pytest.mark.parametrize("pieces,finish,blocks,stop", [
    (['{"resp', 'onse": "hi', ' th\\u00e9', 're"}'], "stop", [("text", ["hi", " thé", "re"])], "end_turn"),
    (['{"tool_calls": [{"name": "f", "argu', 'ments": {"a"', ': 1}}, {"name": "g", "arguments": {}}]}'], "stop",
     [("tool_use", ['{"a"', ": 1}"]), ("tool_use", ["{}"])], "tool_use"),
    (['{"tool_calls": [{"name": "f", "arguments": {"ci', 'ty": "Pa'], "length", [("tool_use", ['{"ci', 'ty": "Pa'])],
     "max_tokens"),
    # not a reply the format allows (text or calls); the writer still keeps one block open at a time
    (['{"response": "hi", "tool_calls": [{"name": "f", "arguments": {}}]}'], "stop",
     [("text", ["hi"]), ("tool_use", ["{}"])], "tool_use"),
])
def test_message_events_of_a_tool_reply(pieces, finish, blocks, stop):
    """MessageEvents over a tool reply's Steps: each block's deltas as the pieces came, the blocks in
    turn at indexes 0, 1, ..., then the stop_reason; the non-streamed message the same blocks."""
    from types import SimpleNamespace

    from nexttok.server.anthropic_messages import Reply
    from nexttok.server.anthropic_stream import MessageEvents

    reply = Reply("m", True, SimpleNamespace(stop_sequence=None))
    events = MessageEvents(reply, 7)
    out = events.opening()
    for step in _steps(pieces, finish):
        out += events.step(step)
    out += events.closing()
    named = [(event["type"], event) for event in out]
    streamed = []
    for name, data in named:
        if name == "content_block_start":
            streamed.append((data["content_block"]["type"], []))
        elif name == "content_block_delta":
            streamed[-1][1].append(data["delta"].get("text", data["delta"].get("partial_json")))
    assert streamed == blocks and _blocks(named)
    assert out[-2]["delta"]["stop_reason"] == stop and out[-2]["usage"]["output_tokens"] == len(pieces)
    message = reply.whole(_steps(pieces, finish), 7)
    assert message["stop_reason"] == stop
    assert [(b["type"], b.get("text", b.get("input"))) for b in message["content"]] == \
        [(kind, "".join(texts) if kind == "text" else json.loads("".join(texts))) for kind, texts in blocks
         if stop != "max_tokens"]


@pytest.mark.parametrize("tools", [None, [TOOL]])
def test_count_tokens_is_the_prompt_create_reports(claude, tools):
    extra = {"tools": tools, "tool_choice": {"type": "any"}} if tools else {}
    args = dict(model=MODEL, system="Be brief.", messages=[{"role": "user", "content": "Weather in Paris?"}], **extra)
    counted = claude.messages.count_tokens(**args).input_tokens
    assert counted == claude.messages.create(max_tokens=2, extra_body=GREEDY, **args).usage.input_tokens
    if tools:
        assert counted > claude.messages.count_tokens(model=MODEL, system="Be brief.",
                                                      messages=args["messages"]).input_tokens


FIELDS = {
    "model": MODEL, "messages": STORY, "max_tokens": 3, "cache_control": {"type": "ephemeral"}, "container": None,
    "diagnostics": {"previous_message_id": "msg_1"}, "inference_geo": "us", "metadata": {"user_id": "u"},
    "output_config": {"effort": "low"}, "service_tier": "auto", "speed": "standard", "stop_sequences": ["\n\n"],
    "system": "Be brief.", "thinking": {"type": "disabled"}, "tool_choice": {"type": "auto"}, "tools": [TOOL],
    "user_profile_id": "p", "workspace_id": "w", "stream": False, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
}


def test_every_documented_field_is_known_and_accepted(claude):
    """Every field of the SDK's MessageCreateParams (and the sampling fields it leaves to extra_body)
    is placed: a field a new SDK adds fails here until it is."""
    from anthropic.types import message_count_tokens_params, message_create_params

    sdk = set(message_create_params.MessageCreateParamsBase.__annotations__)
    assert sdk | {"stream", "temperature", "top_p", "top_k"} == set(FIELDS)
    assert set(message_count_tokens_params.MessageCountTokensParams.__annotations__) <= set(FIELDS)
    for name, value in FIELDS.items():
        body = {"model": MODEL, "messages": STORY, "max_tokens": 3, name: value}
        if name == "tool_choice":  # as on Anthropic's API, tool_choice needs tools
            body["tools"] = [TOOL]
        assert claude.post("/v1/messages", cast_to=object, body=body)["type"] == "message", name
    assert claude.post("/v1/messages", cast_to=object, body=FIELDS)["type"] == "message", "all at once"


BAD = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"bogus_field": 1}, "bogus_field"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "reads text only"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [*STORY, {"role": "assistant", "content": "Once"}]}, "messages[1]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"system": [{"type": "image"}]}, "system[0]"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"container": "ctr_1"}, "container"),
]


@pytest.mark.parametrize("body,named", BAD)
def test_bad_requests_are_anthropic_400s_naming_the_field(claude, body, named):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": STORY, "max_tokens": 5, **body})
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert set(error) == {"type", "error"} and set(error["error"]) == {"type", "message"}
    message = error["error"]["message"]
    assert named in message and "\n" not in message, message


def test_missing_max_tokens_is_named(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": STORY})
    assert caught.value.body["error"]["message"] == "Missing required parameter: max_tokens"


def test_unknown_model_is_a_not_found_error_and_openai_routes_keep_their_shape(claude, server):
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="nope", messages=STORY, max_tokens=2)
    assert caught.value.body["error"]["type"] == "not_found_error" and "'nope'" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="nope", messages=STORY)
    openai_shape = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": STORY,
                                                                         "top_p": 5}, timeout=60).json()
    assert openai_shape["error"]["param"] == "top_p" and "type" not in openai_shape


def test_openapi_lists_the_routes_with_anthropics_errors_and_events(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    create = spec["paths"]["/v1/messages"]["post"]
    assert "text/event-stream" in create["responses"]["200"]["content"]
    assert create["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AnthropicErrorResponse")
    assert "529" in create["responses"] and "429" not in create["responses"]
    assert "/v1/messages/count_tokens" in spec["paths"]
    assert spec["paths"]["/v1/chat/completions"]["post"]["responses"]["429"]["content"]["application/json"][
        "schema"]["$ref"].endswith("/ErrorResponse")


def test_x_api_key_is_honoured_on_every_route(chat_model_dir):
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    with LiveServer(create_app([load_served(str(chat_model_dir), MODEL)], api_key=KEY)) as live:
        good = anthropic.Anthropic(base_url=live.url, api_key=KEY, max_retries=0)
        assert good.messages.create(model=MODEL, messages=STORY, max_tokens=2).usage.output_tokens == 2
        assert good.messages.count_tokens(model=MODEL, messages=STORY).input_tokens > 0
        bad = anthropic.Anthropic(base_url=live.url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as caught:
            bad.messages.create(model=MODEL, messages=STORY, max_tokens=2)
        assert caught.value.body["error"] == {"type": "authentication_error", "message": "Incorrect API key provided"}
        assert httpx.get(live.url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
        missing = httpx.get(live.url + "/v1/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape
        assert httpx.get(live.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
