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
from nexttok.generation.grammar import check_schema_depth

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
        check_schema_depth(parameters, f"tools[{i}]", f"tools[{i}].function.parameters")
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
    """(content, tool_calls) of a reply in the generic format, as OpenAI returns them: each call's
    arguments are the JSON text the model wrote (what a stream sends in pieces: ReplyStream). A
    reply cut short (max_tokens) never shows the format's JSON: a cut call is no content and no
    call, a cut {"response": ...} its text so far.
    read_reply('{"response": "hi"}') == ("hi", []); read_reply('{"response": "hi th') == ("hi th", [])"""
    try:
        reply = json.loads(text)
    except ValueError:
        return _cut_reply(text), []
    if isinstance(reply, dict) and isinstance(reply.get("tool_calls"), list):
        stream = ReplyStream()
        stream.feed(text)
        return None, [call.openai() for call in stream.calls]
    if isinstance(reply, dict) and isinstance(reply.get("response"), str):
        return reply["response"], []
    return text, []


@dataclass
class StreamedCall:
    """A tool call as a stream reads it: its index among the reply's calls, an id, its name (once
    read whole) and its arguments' JSON text so far."""

    index: int
    id: str
    name: str | None = None
    arguments: str = ""
    done: bool = False

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ReplyEvent:
    """What a piece of reply text added: kind "content" (text of {"response": ...}, unescaped),
    "call" (call `index` has its name: a call begins), "arguments" (a piece of call `index`'s
    arguments JSON, as written) or "call_done"."""

    kind: str
    index: int = 0
    text: str = ""


class ReplyStream:
    """The generic format read as it is generated, a piece of text at a time: what a stream can send
    before the reply is whole. The grammar holds the reply to the format, so a small JSON scanner
    (strings, escapes, nesting, commas) finds the response text and each call's name and arguments;
    the arguments are passed on as the raw JSON text the model writes (concatenated: the arguments
    read_reply gives).

        stream = ReplyStream(); stream.feed('{"tool_calls": [{"name": "f", "argum')
        -> [ReplyEvent("call", 0)];  stream.feed('ents": {"a": 1}}]}')
        -> [ReplyEvent("arguments", 0, '{"a": 1}'), ReplyEvent("call_done", 0)]
    """

    def __init__(self):
        self.calls: list[StreamedCall] = []
        self.whole = False  # the reply's JSON has closed (read_reply would read its calls)
        self._stack: list[list] = []  # per open container: [kind "{" or "[", its key or item index, value pending]
        self._string: list[str] | None = None  # the string being read (raw), None outside strings
        self._escape = False
        self._capture: int | None = None  # the depth a call's arguments opened at; -1: just closed
        self._content = _Unescaper()

    def feed(self, text: str) -> list[ReplyEvent]:
        events: list[ReplyEvent] = []
        for ch in text:
            self._char(ch, events)
        return _merged(events)

    def _path(self) -> list:
        return [frame[1] for frame in self._stack]

    def _char(self, ch: str, events: list[ReplyEvent]) -> None:
        captured = self._capture is not None
        if self._string is not None:
            self._in_string(ch, events)
        elif ch == '"':
            self._string, self._escape = [], False
        elif ch in "{[":
            self._open(ch)
        elif ch in "}]":
            self._close()
        elif ch == "," and self._stack:
            top = self._stack[-1]
            if top[0] == "[":
                top[1] += 1
            else:
                top[2] = False  # the value ended: a key comes next
        if captured or self._capture is not None:
            self._argument(ch, events)

    def _in_string(self, ch: str, events: list[ReplyEvent]) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            raw, self._string = "".join(self._string), None
            self._string_done(raw, events)
            return
        self._string.append(ch)
        if self._path() == ["response"] and self._stack[-1][2]:
            events.extend(ReplyEvent("content", 0, t) for t in self._content.feed(ch))

    def _string_done(self, raw: str, events: list[ReplyEvent]) -> None:
        top = self._stack[-1] if self._stack else None
        if top is not None and top[0] == "{" and not top[2]:  # a key: its value follows
            top[1], top[2] = json.loads(f'"{raw}"'), True
            return
        path = self._path()
        if len(path) == 3 and path[0] == "tool_calls" and path[2] == "name" and self._capture is None:
            call = self._call(path[1])
            call.name = json.loads(f'"{raw}"')
            events.append(ReplyEvent("call", call.index))
            if call.arguments:  # arguments written before the name (held until now)
                events.append(ReplyEvent("arguments", call.index, call.arguments))

    def _open(self, ch: str) -> None:
        path = self._path()
        if self._capture is None and len(path) == 3 and path[0] == "tool_calls" and path[2] == "arguments":
            self._capture = len(self._stack)
        self._stack.append([ch, 0 if ch == "[" else None, False])

    def _close(self) -> None:
        self._stack.pop()
        self.whole = not self._stack
        if self._capture is not None and len(self._stack) == self._capture:
            self._capture = -1  # the closing bracket still belongs to the arguments (_char passes it on)

    def _argument(self, ch: str, events: list[ReplyEvent]) -> None:
        call = self._call(self._path()[1])
        call.arguments += ch
        if call.name is not None:
            events.append(ReplyEvent("arguments", call.index, ch))
        if self._capture == -1:
            self._capture, call.done = None, True
            events.append(ReplyEvent("call_done", call.index))

    def _call(self, index: int) -> StreamedCall:
        while len(self.calls) <= index:
            self.calls.append(StreamedCall(len(self.calls), f"call_{uuid.uuid4().hex[:24]}"))
        return self.calls[index]


class _Unescaper:
    """A JSON string's characters, unescaped as they arrive (an escape is held until whole; a high
    surrogate until its low one)."""

    def __init__(self):
        self.held = ""

    def feed(self, ch: str) -> list[str]:
        self.held += ch
        if self.held.startswith("\\"):
            if len(self.held) < 2 or (self.held[1] == "u" and len(self.held) < 6):
                return []
            if self.held[1] == "u" and 0xD800 <= int(self.held[2:6], 16) < 0xDC00 and len(self.held) < 12:
                return []  # a high surrogate: wait for the low one
        try:
            text = json.loads(f'"{self.held}"')
        except ValueError:
            return []
        self.held = ""
        return [text]


def _merged(events: list[ReplyEvent]) -> list[ReplyEvent]:
    """Neighbouring pieces of the same kind and call as one event."""
    out: list[ReplyEvent] = []
    for e in events:
        if out and e.kind in ("content", "arguments") and out[-1].kind == e.kind and out[-1].index == e.index:
            out[-1] = ReplyEvent(e.kind, e.index, out[-1].text + e.text)
        else:
            out.append(e)
    return out


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
