"""POST /v1/responses through the official `openai` client: the same generation as the chat route
for the same conversation, the documented stream events in order, structured output, function
tools and their outputs, kept responses, and every documented request field."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

MODEL = "tiny"
CITY = {"type": "object", "required": ["city"], "additionalProperties": False,
        "properties": {"city": {"enum": ["Paris", "Rome"]}}}
TOOL = {"type": "function", "name": "pick_city", "description": "Pick a city", "parameters": CITY}
CHAT_TOOL = {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added"]
TEXT_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


def _post(client, body):
    return httpx.post(f"{client.base_url}responses", json=body, timeout=60)


def _chat(client, messages, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kwargs)


def test_text_input_is_the_chat_routes_generation(client):
    reply = client.responses.create(model=MODEL, input="Tell me a story", instructions="Be brief.",
                                    max_output_tokens=12, temperature=0)
    chat = _chat(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}],
                 max_tokens=12)
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens == 12
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    message = reply.output[0]
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"


def test_message_items_with_text_parts(client):
    items = [{"role": "developer", "content": "Answer in French."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello "},
                                                             {"type": "input_text", "text": "there"}]}]
    reply = client.responses.create(model=MODEL, input=items, max_output_tokens=6, temperature=0)
    chat = _chat(client, [{"role": "developer", "content": "Answer in French."},
                          {"role": "user", "content": "Hello there"}], max_tokens=6)
    assert reply.output_text == chat.choices[0].message.content


def test_stream_events_come_in_the_documented_order(client):
    args = dict(model=MODEL, input="Once upon a time", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == TEXT_EVENTS + ["response.output_text.delta"] * deltas + TEXT_CLOSE + ["response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-2].item.content[0].text == whole.output_text
    assert events[-1].response.output_text == whole.output_text and events[0].response.status == "in_progress"


def test_structured_output_follows_the_schema(client):
    class City(BaseModel):
        city: Literal["Paris", "Rome"]

    parsed = client.responses.parse(model=MODEL, input="Which city?", text_format=City, max_output_tokens=40,
                                    temperature=1.0)
    assert parsed.output_parsed.city in ("Paris", "Rome")  # the SDK parsed the reply as City
    raw = client.responses.create(model=MODEL, input="Which city?", max_output_tokens=40, temperature=1.0,
                                  text={"format": {"type": "json_schema", "name": "city", "schema": CITY}})
    assert json.loads(raw.output_text)["city"] in ("Paris", "Rome")


def test_a_function_call_and_its_output_round_trip(client):
    ask = [{"role": "user", "content": "Where?"}]
    reply = client.responses.create(model=MODEL, input=ask, tools=[TOOL], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    chat = _chat(client, ask, tools=[CHAT_TOOL], tool_choice="required", max_tokens=60)
    (call,) = reply.output
    assert call.type == "function_call" and call.name == "pick_city" and reply.status == "completed"
    assert call.arguments == chat.choices[0].message.tool_calls[0].function.arguments
    events = list(client.responses.create(model=MODEL, input=ask, tools=[TOOL], tool_choice="required",
                                          max_output_tokens=60, temperature=0, stream=True))
    # the arguments stream as they are generated: several deltas, joined the call's arguments
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas > 1 and kinds == TEXT_EVENTS[:2] + CALL_EVENTS[:1] + CALL_EVENTS[1:2] * deltas + CALL_EVENTS[2:] + \
        ["response.completed"]
    assert "".join(e.delta for e in events if e.type.endswith("arguments.delta")) == call.arguments
    assert events[-1].response.output[0].arguments == call.arguments and events[2].item.name == call.name
    follow = [*ask, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "It is Paris."}]
    answer = client.responses.create(model=MODEL, input=follow, tools=[TOOL], tool_choice="none",
                                     max_output_tokens=8, temperature=0)
    chat_follow = [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "It is Paris."}]
    assert answer.output_text == _chat(client, chat_follow, tools=[CHAT_TOOL], tool_choice="none",
                                       max_tokens=8).choices[0].message.content
    # previous_response_id continues from the kept response: the same conversation
    continued = client.responses.create(model=MODEL, previous_response_id=reply.id, tools=[TOOL], tool_choice="none",
                                        input=[follow[-1]], max_output_tokens=8, temperature=0)
    assert continued.output_text == answer.output_text


def test_kept_responses_retrieve_delete_and_store_false(client):
    kept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3, temperature=0)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    unkept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Again", previous_response_id=unkept.id)


def test_output_logprobs_when_included(client):
    reply = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0, top_logprobs=2,
                                    include=["message.output_text.logprobs"])
    chat = _chat(client, [{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True, top_logprobs=2)
    ours, theirs = reply.output[0].content[0].logprobs, chat.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in ours] == [(t.token, t.logprob) for t in theirs]
    assert [len(t.top_logprobs) for t in ours] == [2] * 4


RESPONSES_FIELDS = {
    "model": MODEL, "input": "Hi", "access_programs": None, "background": False, "background_options": None,
    "context_management": None, "conversation": None, "image": None, "include": ["message.output_text.logprobs"],
    "instructions": "Be brief.", "max_output_tokens": 3, "max_tool_calls": 2, "metadata": {"run": "1"},
    "moderation": None, "parallel_tool_calls": True, "previous_response_id": None, "prompt": None,
    "prompt_cache_key": "k", "prompt_cache_options": {}, "prompt_cache_retention": "in_memory",
    "reasoning": {"effort": "low"}, "safety_identifier": "u", "service_tier": "auto", "store": True,
    "stream": False, "stream_options": None, "temperature": 0.5, "text": {"format": {"type": "text"}},
    "tool_choice": "auto", "tools": [TOOL], "top_logprobs": 2, "top_p": 0.9, "truncation": "disabled", "user": "u",
}


def test_every_documented_field_is_known_and_accepted(client):
    from openai.types.responses import response_create_params

    assert set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"} == set(RESPONSES_FIELDS)
    for name, value in RESPONSES_FIELDS.items():
        response = _post(client, {"model": MODEL, "input": "Hi", "max_output_tokens": 3, name: value})
        assert response.status_code == 200, f"{name}: {response.text}"
    assert _post(client, RESPONSES_FIELDS).status_code == 200, "all at once"


BAD = [
    ({"input": [{"type": "computer_call"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0]"),
    ({"input": []}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "mcp"}, "tools": [TOOL]}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"previous_response_id": "resp_nothing"}, "previous_response_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"bogus_field": 1}, "bogus_field"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_requests_name_the_field(client, body, param):
    response = _post(client, {"model": MODEL, "input": "Hi", **body})
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


def _steps(pieces: list[str], finish: str) -> list:
    from nexttok.generation.loop import Step

    return [Step(i, 0, text, text, 0.0, 1, [], [], None, 0.0, i == 0, finish if i == len(pieces) - 1 else None)
            for i, text in enumerate(pieces)]


def test_a_tool_reply_streams_its_text_or_its_call_as_generated():
    """ResponseEvents with tools: a {"response": ...} streams as a message, delta by delta; a call
    cut by max_output_tokens closes "incomplete" with the arguments it had (what was sent)."""
    from nexttok.server.responses_items import ResponseBuilder
    from nexttok.server.responses_stream import ResponseEvents

    def run(pieces, finish):
        events = ResponseEvents(ResponseBuilder("m", {}, True, None, None), 7)
        out = events.opening()
        for step in _steps(pieces, finish):
            out += events.step(step)
        return out + events.closing(), events.final

    kinds, final = run(['{"resp', 'onse": "hi', ' th\\u00e9', 're"}'], "stop")
    texts = [e["delta"] for e in kinds if e["type"] == "response.output_text.delta"]
    assert texts == ["hi", " thé", "re"] and final["output"][0]["content"][0]["text"] == "hi thére"
    assert [e["type"] for e in kinds][2:4] == TEXT_EVENTS[2:4] and kinds[-1]["type"] == "response.completed"
    kinds, final = run(['{"tool_calls": [{"name": "pick_city", "arguments": {"ci', 'ty": "Pa'], "length")
    (item,) = final["output"]
    assert item["status"] == "incomplete" and item["arguments"] == '{"city": "Pa' and final["status"] == "incomplete"
    assert [e["delta"] for e in kinds if e["type"].endswith("arguments.delta")] == ['{"ci', 'ty": "Pa']
    assert [e["type"] for e in kinds][-3:] == CALL_EVENTS[2:] + ["response.incomplete"]
