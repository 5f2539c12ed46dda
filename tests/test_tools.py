"""Tool calls through the official openai client: tools rendered into the prompt, the reply held to
the generic JSON format by the grammar stage and read back into tool_calls (streamed and not); a
following tool message works; bad tools / tool_choice are a 400 naming the parameter."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from nexttok.generation.tools import parse_tools, read_reply, reply_schema, with_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tiny_live):
    server, _ = tiny_live
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _check_calls(calls, allowed=("get_weather",)):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in allowed
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_named_and_required_choices_always_call(client):
    for choice, allowed in ([{"type": "function", "function": {"name": "get_weather"}}, ("get_weather",)],
                            ["required", ("get_weather", "get_time")]):
        for seed in range(3):
            done = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, TIME],
                                                  tool_choice=choice, temperature=1, seed=seed, max_tokens=200)
            choice_ = done.choices[0]
            assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
            _check_calls(choice_.message.tool_calls, allowed)


def test_streamed_tool_call_and_the_tool_message_round_trip(client, tiny_live):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0.8, seed=1,
        max_tokens=200, stream=True))
    pieces = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert pieces and pieces[0].index == 0 and pieces[0].id and pieces[0].function.name == "get_weather"
    # the arguments arrive as they are generated, in many deltas (OpenAI's way); joined, they are the call
    assert len([p for p in pieces if p.function.arguments]) > 1 and all(p.id is None for p in pieces[1:])
    arguments = "".join(p.function.arguments or "" for p in pieces)
    plain = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0.8, seed=1, max_tokens=200)
    assert [("get_weather", arguments)] == \
        [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls]
    call = plain.choices[0].message.tool_calls[0]
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 21})}]
    answer = client.chat.completions.create(model="tiny", messages=follow, tools=[WEATHER], temperature=0, seed=1,
                                            max_tokens=30)
    # the follow-up's prompt is the whole round trip: the tools' system prompt, the past call and
    # the tool's result, rendered by the model's template (the same count as rendering it here)
    served = tiny_live[1]
    messages = with_tools([*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                           follow[-1]], parse_tools([WEATHER]), "auto")
    prompt = served.chat_template.render(messages)
    assert '{"celsius": 21}' in prompt and call.function.arguments.strip("{}") in prompt
    assert answer.usage.prompt_tokens == len(served.tokenizer.encode(prompt))


def test_auto_answers_with_text_or_a_call_and_none_is_free_text(client):
    for seed in range(4):
        done = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], temperature=1,
                                              seed=seed, max_tokens=200)
        message = done.choices[0].message
        if message.tool_calls:
            _check_calls(message.tool_calls)
        elif done.choices[0].finish_reason == "stop":
            assert isinstance(message.content, str)
    free = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none",
                                          temperature=0, max_tokens=5)
    plain = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=5)
    assert free.choices[0].message.content == plain.choices[0].message.content  # tools not even shown


@pytest.mark.parametrize("kwargs, param", [
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0]"),
    (dict(tools=[WEATHER, WEATHER]), "tools"),
    (dict(tools=[WEATHER], response_format={"type": "json_object"}), "response_format"),
])
def test_bad_tools_are_a_400_naming_the_parameter(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=ASK, **kwargs)
    assert caught.value.body["param"] == param, caught.value.body


def test_reply_schema_and_reading():
    tools = parse_tools([WEATHER, TIME])
    auto = reply_schema(tools, "auto")
    jsonschema.validate({"response": "hi"}, auto)
    jsonschema.validate({"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}, auto)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [{"name": "get_time", "arguments": {"zone": "PST"}}]}, auto)
    single = reply_schema(tools, "required", parallel=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}] * 2}, single)
    content, calls = read_reply('{"tool_calls": [{"name": "get_time", "arguments": {"zone": "CET"}}]}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"zone": "CET"}
    # cut by max_tokens: the format's JSON never comes back as content
    assert read_reply('{"tool_ca') == (None, [])
    assert read_reply('{"tool_calls": [{"name": "get_time", "argu') == (None, [])
    assert read_reply('{"response": "It is \\u00e') == ("It is ", [])
    assert read_reply('{ "response" : "sunny, \\"warm') == ('sunny, "warm', [])
    merged = with_tools([{"role": "system", "content": "Be brief."}, *ASK], tools, "auto")
    assert merged[0]["content"].startswith("Be brief.\n\nYou can call these tools:") and len(merged) == 2


def test_reply_stream_reads_calls_and_text_as_they_are_written():
    """tools.ReplyStream over any cut of a reply into pieces: each call opens once its name is whole,
    its arguments arrive as the raw JSON written (joined: read_reply's arguments, escapes, nesting and
    brackets inside strings included), a {"response": ...} streams its text unescaped, and the
    reply is whole once its JSON closes."""
    import random

    from nexttok.generation.tools import ReplyStream, read_reply

    calls = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\"ris]}", "n": [1, {"x": "}"}],'
             ' "ok": true, "u": "\\u00e9"}}, {"name": "f2", "arguments": {}}]}')
    text = '{"response": "h\\u00e9llo \\ud83d\\ude00 \\"q\\" \\n done"}'
    rng = random.Random(0)
    for _ in range(100):
        for reply in (calls, text):
            stream, events, at = ReplyStream(), [], 0
            while at < len(reply):
                assert not stream.whole  # the reply's JSON closes with its last character
                step = rng.randint(1, 6)
                events += stream.feed(reply[at : at + step])
                at += step
            assert stream.whole
            content, expected = read_reply(reply)
            args = {}
            for e in events:
                if e.kind == "arguments":
                    args[e.index] = args.get(e.index, "") + e.text
            assert [args.get(i) for i in range(len(expected))] == [c["function"]["arguments"] for c in expected]
            assert [e.kind for e in events if e.kind in ("call", "call_done")] == ["call", "call_done"] * len(expected)
            assert [stream.calls[i].name for i in range(len(expected))] == [c["function"]["name"] for c in expected]
            assert "".join(e.text for e in events if e.kind == "content") == (content or "")
    assert json.loads(read_reply(calls)[1][0]["function"]["arguments"])["city"] == 'Pa"ris]}'
