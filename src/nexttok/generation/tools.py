"""Tool calls (OpenAI's `tools` and `tool_choice`) on any chat model, in llama.cpp's generic format.

The model is told about the tools in a system message (and, when its chat template takes `tools`,
through the template too) and answers in JSON, held to it by the grammar stage:

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}   a call (or several)
    {"response": "It is sunny."}                                                   plain text (auto)

tool_choice: "auto" allows either, "required" a call to any tool, {"type": "function", "function":
{"name": ...}} a call to that one, "none" no tools at all. Every call's arguments follow its tool's
JSON schema (`parameters`), so they always parse. The reply is read back into OpenAI's
`tool_calls` (ids, arguments as a JSON string) or `content`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from nexttok.errors import InvalidParameter

MAX_TOOLS = 64


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object


def parse_tools(tools) -> list[Tool]:
    """OpenAI's tools list, checked: [{type: function, function: {name, description?, parameters?}}]."""
    if not isinstance(tools, list) or not 1 <= len(tools) <= MAX_TOOLS:
        raise InvalidParameter("tools", f"tools must be a list of 1 to {MAX_TOOLS} tools")
    parsed = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name or len(name) > 64 or not name.replace("_", "a").replace(
                "-", "a").isalnum():
            raise InvalidParameter(f"tools[{i}]", f"tools[{i}] must be {{type: function, function: {{name, "
                                   "description, parameters}}}} with a name of letters, digits, _ and -")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidParameter(f"tools[{i}]", f"tools[{i}].function.parameters must be a JSON schema object")
        parsed.append(Tool(name, str(function.get("description", "")), parameters))
    if len({t.name for t in parsed}) != len(parsed):
        raise InvalidParameter("tools", "tool names must be distinct")
    return parsed


def from_functions(functions: list, function_call) -> tuple[list[dict], str | dict | None]:
    """OpenAI's deprecated `functions` / `function_call` as (tools, tool_choice):
    function_call "auto" | "none" | {"name": ...} -> the same choice of those tools."""
    tools = [{"type": "function", "function": f} for f in functions]
    if isinstance(function_call, dict):
        return tools, {"type": "function", "function": {"name": function_call.get("name")}}
    return tools, function_call


def parse_choice(choice, tools: list[Tool]) -> str | Tool:
    """tool_choice → "auto" | "none" | "required" | the named Tool."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(name, str):
        for tool in tools:
            if tool.name == name:
                return tool
        raise InvalidParameter("tool_choice", f"tool_choice names {name!r}, which is not in tools")
    raise InvalidParameter("tool_choice", 'tool_choice must be "auto", "none", "required" or '
                           '{"type": "function", "function": {"name": ...}}')


def reply_schema(tools: list[Tool], choice: str | Tool, parallel: bool = False, max_calls: int | None = None) -> dict:
    """The JSON schema the model's reply must follow under tool_choice; one call unless parallel
    (OpenAI's parallel_tool_calls, which llama.cpp's server also defaults to false), then up to
    max_calls (None: any number)."""
    chosen = [choice] if isinstance(choice, Tool) else tools
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for t in chosen]
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": items, "minItems": 1,
                                                             **_most(1 if not parallel else max_calls)}},
            "required": ["tool_calls"], "additionalProperties": False}
    if choice != "auto":
        return call
    text = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
            "additionalProperties": False}
    return {"anyOf": [call, text]}


def _most(calls: int | None) -> dict:
    return {} if calls is None else {"maxItems": calls}


def system_prompt(tools: list[Tool], choice: str | Tool) -> str:
    """What the model is told: the tools, and the JSON its reply must be."""
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                  ensure_ascii=False) for t in tools)
    if isinstance(choice, Tool):
        call = json.dumps({"tool_calls": [{"name": choice.name, "arguments": {}}]}).replace("{}", "{...}")
        how = f"Call the tool {choice.name}: reply {call}."
    elif choice == "required":
        how = 'Call one or more tools: reply {"tool_calls": [{"name": ..., "arguments": {...}}]}.'
    else:
        how = ('Reply in JSON: either {"tool_calls": [{"name": ..., "arguments": {...}}]} to call tools, '
               'or {"response": "..."} to answer the user directly.')
    return f"You can call these tools:\n{listed}\n{how}"


def with_tools(messages: list[dict], tools: list[Tool], choice: str | Tool) -> list[dict]:
    """The messages with the tools' system prompt added to the first system message (or first)."""
    text = system_prompt(tools, choice)
    if messages and isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer") \
            and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def read_reply(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a reply in the generic format, as OpenAI returns them. A reply cut
    short (max_tokens) never shows the format's JSON: a cut call is no content and no call, a cut
    {"response": ...} its text so far.
    read_reply('{"response": "hi"}') == ("hi", []); read_reply('{"response": "hi th') == ("hi th", [])"""
    try:
        reply = json.loads(text)
    except ValueError:
        return _cut_reply(text), []
    if isinstance(reply, dict) and isinstance(reply.get("tool_calls"), list):
        return None, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": call["name"], "arguments": json.dumps(call["arguments"],
                                                                                  ensure_ascii=False)}}
                      for call in reply["tool_calls"]]
    if isinstance(reply, dict) and isinstance(reply.get("response"), str):
        return reply["response"], []
    return text, []


_CUT_RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _cut_reply(text: str) -> str | None:
    """The text of a reply the grammar was still writing when it stopped: the part of a
    {"response": "..."} string written so far, or None inside a call (or before either began)."""
    opened = _CUT_RESPONSE.match(text)
    if opened is None:
        return None
    rest = text[opened.end():]
    for cut in range(len(rest), max(-1, len(rest) - 8), -1):  # drop a half-written escape (\u12)
        try:
            return json.loads(f'"{rest[:cut]}"')
        except ValueError:
            continue
    return None
