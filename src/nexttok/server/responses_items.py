"""OpenAI's Responses API in terms of the chat route: input items → chat messages, function
tools → chat tools, and a reply's Steps → output items (a message, or function calls).

Input items: messages (role + text or input_text / output_text parts), function_call (a call the
assistant made before) and function_call_output (its result: a tool message); reasoning items are
dropped (these models keep no reasoning apart). Anything else is a 400 naming the item.
"""

from __future__ import annotations

import time
import uuid

from nexttok.errors import InvalidParameter
from nexttok.generation.grammar import check_schema_depth
from nexttok.generation.loop import Step
from nexttok.generation.tools import read_reply
from nexttok.server.openai_shapes import token_logprobs

TEXT_PARTS = ("input_text", "output_text", "text")
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for output logprobs


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_messages(items: str | list) -> list[dict]:
    """Chat messages of a Responses `input` (a string: one user message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append(_message(where, item))
        elif kind == "function_call":
            call = {"id": _text(where, item, "call_id"), "type": "function",
                    "function": {"name": _text(where, item, "name"), "arguments": _text(where, item, "arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)  # calls made together are one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = _joined(f"{where}.output", output) if isinstance(output, list) else output
            if not isinstance(content, str):
                raise InvalidParameter(where, f"{where}.output must be a string or a list of input_text parts")
            messages.append({"role": "tool", "tool_call_id": _text(where, item, "call_id"), "content": content})
        elif kind != "reasoning":
            raise InvalidParameter(where, f"{where} must be a message, function_call or function_call_output "
                                   f"item, got type {kind!r}")
    if not messages:
        raise InvalidParameter("input", "input has no message")
    return messages


def _message(where: str, item: dict) -> dict:
    role, content = item.get("role"), item.get("content")
    if role not in MESSAGE_ROLES:
        raise InvalidParameter(where, f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
    if isinstance(content, list):
        content = _joined(f"{where}.content", content)
    if not isinstance(content, str):
        raise InvalidParameter(where, f"{where}.content must be a string or a list of text parts")
    return {"role": role, "content": content}


def _joined(where: str, parts: list) -> str:
    texts = []
    for j, part in enumerate(parts):
        if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidParameter(where, f"{where}[{j}] must be a text part (input_text or output_text), got "
                                   f"{kind!r}: this model reads text only")
        texts.append(part["text"])
    return "".join(texts)


def _text(where: str, item: dict, key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidParameter(where, f"{where}.{key} must be a non-empty string")
    return value


def chat_tools(tools: list | None, choice) -> tuple[list[dict] | None, str | dict | None]:
    """Responses function tools ({type, name, description, parameters}) and tool_choice in the chat
    route's form; other tool types (web search, files, computers) are not available here."""
    if tools is None:
        return None, choice
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidParameter(f"tools[{i}]", f"tools[{i}]: only function tools are available here, got {kind!r}")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        converted.append({"type": "function", "function": function})
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InvalidParameter("tool_choice", 'tool_choice must be "auto", "none", "required" or '
                                   '{"type": "function", "name": ...}')
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return converted, choice


def output_format(text: dict | None) -> dict | None:
    """text.format → the chat route's response_format."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidParameter("text", 'text.format.type must be "text", "json_object" or "json_schema"')
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    check_schema_depth(fmt.get("schema"), "text", "text.format.schema")
    schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


class ResponseBuilder:
    """One response's object and items, from the Steps of its reply."""

    def __init__(self, model: str, request: dict, tools: bool, tokenizer, logprobs: int | None):
        self.id, self.created_at, self.model = new_id("resp"), int(time.time()), model
        self.request, self.tools, self.tokenizer, self.logprobs = request, tools, tokenizer, logprobs
        self.message_id = new_id("msg")

    def response(self, status: str, output: list[dict], usage: dict | None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": output, "usage": usage, "error": None,
                "incomplete_details": incomplete, **self.request}

    def items(self, steps: list[Step]) -> list[dict]:
        """The output items of a whole reply: function calls, or a message (none for a reply cut
        inside a call)."""
        text, status = "".join(s.text for s in steps), self.status(steps)
        if not self.tools:
            return [self.message(text, status, steps)]
        content, calls = read_reply(text)
        if calls:
            return [self.call(c) for c in calls]
        return [] if content is None else [self.message(content, status, None)]

    @staticmethod
    def status(steps: list[Step]) -> str:
        return "incomplete" if steps and steps[-1].finish_reason == "length" else "completed"

    def message(self, text: str, status: str, steps: list[Step] | None) -> dict:
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant",
                "content": [self.text_part(text, steps)]}

    def text_part(self, text: str, steps: list[Step] | None) -> dict:
        part = {"type": "output_text", "text": text, "annotations": []}
        if self.logprobs is not None:
            part["logprobs"] = self.token_logprobs(steps or [])
        return part

    def token_logprobs(self, steps: list[Step]) -> list[dict]:
        return token_logprobs(self.tokenizer, steps, self.logprobs)

    @staticmethod
    def call(call: dict) -> dict:
        return {"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"]}


def usage(prompt_tokens: int, steps: list[Step]) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(steps), "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + len(steps)}


def as_messages(output: list[dict]) -> list[dict]:
    """A response's output items as the chat messages a following turn starts from."""
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    if calls:
        return [{"role": "assistant", "content": None, "tool_calls": calls}]
    texts = [part["text"] for item in output if item["type"] == "message" for part in item["content"]]
    return [{"role": "assistant", "content": "".join(texts)}] if texts else []
