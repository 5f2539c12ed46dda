"""Anthropic's Messages API in terms of the chat route: a request's system prompt, messages, tools
and tool_choice become chat messages and OpenAI-shaped tools; a reply's Steps become Anthropic
content blocks (text, tool_use) and a stop_reason.

Content blocks read: text; in assistant turns tool_use (a past call, kept with its id) and
thinking (the template's reasoning_content; redacted_thinking is dropped, nothing in it is
readable); in user turns tool_result (a string or text blocks), which must answer a tool_use of
the assistant turn just before it. image, document and any other block are a 400 naming the block.
"""

from __future__ import annotations

import json
import re

from nexttok.errors import InvalidParameter
from nexttok.generation.grammar import check_schema_depth
from nexttok.generation.loop import Generation, Step
from nexttok.generation.tools import ReplyStream
from nexttok.server.responses_items import new_id

ROLES = ("user", "assistant")
TEXT_ONLY = ("image", "document")  # blocks Anthropic's models read and ours cannot
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and {"type": "tool", "name": ...}


def chat_messages(system: str | list | None, messages: list) -> list[dict]:
    """The chat messages of a request: the system prompt first, then each turn.
    chat_messages("Be brief.", [{"role": "user", "content": "Hi"}])
    -> [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]"""
    chat = [{"role": "system", "content": _texts("system", system)}] if system else []
    calls: set[str] = set()  # the ids of the tool_use blocks in the assistant turn just before
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise _error("messages", f'{where}.role must be "user" or "assistant", got {role!r}')
        blocks = _blocks(where, message.get("content"))
        if role == "assistant":
            turn = _assistant_turn(where, blocks)
            calls = {call["id"] for call in turn.get("tool_calls", [])}
            chat.append(turn)
        else:
            chat += _user_turn(where, blocks, calls)
            calls = set()
    if messages[-1].get("role") == "assistant":
        raise _error("messages", f"messages[{len(messages) - 1}]: a final assistant message (prefill) "
                               "is not available here; end with a user message")
    return chat


def _blocks(where: str, content) -> list[dict]:
    """A turn's content as blocks (a string is one text block), each an object with a type."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise _error("messages", f"{where}.content must be a string or a non-empty list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _error("messages", f"{where}.content[{j}] must be a content block {{type, ...}}")
    return content


def _assistant_turn(where: str, blocks: list[dict]) -> dict:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_string(at, block, "text"))
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict):
                raise _error("messages", f"{at}.input must be an object")
            calls.append({"id": _string(at, block, "id"), "type": "function",
                          "function": {"name": _string(at, block, "name"),
                                       "arguments": json.dumps(block["input"], ensure_ascii=False)}})
        elif kind == "thinking":
            thinking.append(_string(at, block, "thinking"))
        elif kind != "redacted_thinking":
            raise _refused(at, kind, "an assistant turn takes text, tool_use and thinking blocks")
    turn = {"role": "assistant", "content": "".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    if thinking:
        turn["reasoning_content"] = "".join(thinking)
    return turn


def _user_turn(where: str, blocks: list[dict], calls: set[str]) -> list[dict]:
    """A user turn as chat messages: each tool_result a tool message, the text between them user
    messages, in their order."""
    turn, texts = [], []
    for j, block in enumerate(blocks):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_string(at, block, "text"))
        elif kind == "tool_result":
            if texts:
                turn.append({"role": "user", "content": "".join(texts)})
                texts = []
            tool_use_id = _string(at, block, "tool_use_id")
            if tool_use_id not in calls:
                raise _error("messages", f"{at}.tool_use_id {tool_use_id!r} matches no tool_use block of "
                                       "the assistant message just before it")
            turn.append({"role": "tool", "tool_call_id": tool_use_id, "content": _tool_result(at, block)})
        else:
            raise _refused(at, kind, "a user turn takes text and tool_result blocks")
    if texts:
        turn.append({"role": "user", "content": "".join(texts)})
    return turn


def _tool_result(at: str, block: dict) -> str:
    """A tool_result's content as text; is_error marks it as the tool's error."""
    content = block.get("content", "")
    text = content if isinstance(content, str) else _texts(f"{at}.content", content)
    return f"Error: {text}" if block.get("is_error") is True else text


def _texts(where: str, blocks) -> str:
    """The text of a string or of a list of text blocks (the system prompt, a tool_result's content)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _error(where, f"{where} must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise _refused(f"{where}[{j}]", kind, "only text blocks are read here")
        texts.append(_string(f"{where}[{j}]", block, "text"))
    return "".join(texts)


def _string(at: str, block: dict, key: str) -> str:
    """block[key], a string (non-empty but for a text block's text)."""
    value = block.get(key)
    if not isinstance(value, str):
        raise _error(at, f"{at}.{key} must be a string")
    if not value and key != "text":
        raise _error(at, f"{at}.{key} must not be empty")
    return value


def _refused(at: str, kind, allowed: str) -> InvalidParameter:
    """The error for a block this server does not read: images and documents (text models), or
    a type unknown here."""
    if kind in TEXT_ONLY:
        return _error(at, f"{at}: {kind} blocks are not available: this model reads text only")
    return _error(at, f"{at}.type: unknown content block type {kind!r}; {allowed}")


def _error(at: str, message: str) -> InvalidParameter:
    """InvalidParameter naming the request field that `at` is inside:
    _error("messages[2].content[0]", "...").param == "messages"."""
    return InvalidParameter(at.split("[")[0].split(".")[0], message)


def chat_tools(tools: list | None, choice: dict | None) -> tuple[list[dict] | None, str | dict | None, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) in the chat route's terms. Client tools only
    ({name, description, input_schema}); disable_parallel_tool_use: false allows several calls
    per reply (left out: one, the chat route's default)."""
    converted = None if tools is None else [_tool(i, tool) for i, tool in enumerate(tools)]
    if choice is None:
        return converted, None, None
    kind = choice.get("type")
    disable = choice.get("disable_parallel_tool_use")
    if kind not in (*TOOL_CHOICES, "tool") or (disable is not None and not isinstance(disable, bool)):
        raise InvalidParameter("tool_choice", 'tool_choice must be {"type": "auto" | "any" | "none"} or '
                               '{"type": "tool", "name": ...}, with disable_parallel_tool_use true or false')
    if kind == "tool":
        chat_choice = {"type": "function", "function": {"name": _string("tool_choice", choice, "name")}}
    else:
        chat_choice = TOOL_CHOICES[kind]
    return converted, chat_choice, None if disable is None else not disable


def _tool(i: int, tool) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise _error("tools", f"{where}: only client tools {{name, description, input_schema}} are "
                               f"available here, got type {kind!r}")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _error("tools", f"{where}.name must be 1 to 64 letters, digits, _ or -")
    if not isinstance(schema, dict):
        raise _error("tools", f"{where}.input_schema must be a JSON schema object")
    check_schema_depth(schema, "tools", f"{where}.input_schema")  # here, or the chat route names its own field
    description = tool.get("description", "")
    if not isinstance(description, str):
        raise _error("tools", f"{where}.description must be a string")
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def output_format(config: dict | None) -> dict | None:
    """output_config.format ({"type": "json_schema", "schema": ...}) as the chat route's response_format."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidParameter("output_config", 'output_config.format must be {"type": "json_schema", "schema": {...}}')
    check_schema_depth(fmt["schema"], "output_config", "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


class Reply:
    """One message's object and content blocks, from the Steps of its reply. With tools the reply
    is JSON in tools.py's format, read back into tool_use blocks or a text block (the format has
    no reply that is both)."""

    def __init__(self, model: str, tools: bool, generation: Generation):
        self.id, self.model, self.tools, self.generation = new_id("msg"), model, tools, generation

    def content(self, steps: list[Step]) -> tuple[list[dict], bool]:
        """(the reply's blocks, whether it called tools: its JSON is whole and has calls). The blocks
        are what its stream sent (anthropic_stream.py), read the same way (tools.ReplyStream): the
        text, none for an empty reply; each call written whole. A call cut by max_tokens is left
        out: its half-written input is no object to claim (the stream sent it as it came)."""
        text = "".join(s.text for s in steps)
        if not self.tools:
            return ([{"type": "text", "text": text}] if text else []), False
        stream = ReplyStream()
        said = "".join(e.text for e in stream.feed(text) if e.kind == "content")
        blocks = [{"type": "text", "text": said}] if said else []
        blocks += [tool_use(call.name, json.loads(call.arguments)) for call in stream.calls if call.done and call.name]
        return blocks, stream.whole and bool(stream.calls)

    def stop(self, steps: list[Step], called: bool) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of a whole reply; called: it made calls (its JSON is whole)."""
        if called:
            return "tool_use", None
        if steps and steps[-1].finish_reason == "length":  # max_tokens, or the context window is full
            return "max_tokens", None
        if self.generation.stop_sequence is not None:
            return "stop_sequence", self.generation.stop_sequence
        return "end_turn", None

    def message(self, content: list[dict], stop: tuple[str | None, str | None], usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}

    def whole(self, steps: list[Step], prompt_tokens: int) -> dict:
        content, called = self.content(steps)
        return self.message(content, self.stop(steps, called), usage(prompt_tokens, len(steps)))


def tool_use(name: str, tool_input: dict) -> dict:
    """A tool_use block: tool_use("f", {}) -> {"type": "tool_use", "id": "toolu_…", "name": "f", "input": {}}."""
    return {"type": "tool_use", "id": new_id("toolu"), "name": name, "input": tool_input}


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}
