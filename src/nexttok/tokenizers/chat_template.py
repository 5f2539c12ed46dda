"""Chat templates: messages → prompt text, with the model's own Jinja template.

The template comes from tokenizer_config.json ("chat_template", a string or a list of named
templates) or a chat_template.jinja file beside it, and runs in jinja2's immutable sandbox with
the helpers HF templates expect (raise_exception, tojson, strftime_now, loop controls).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """No template, a template that does not compile, or messages it refuses."""


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters, which would change prompts
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _token_text(value) -> str:
    """bos/eos in tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template does not compile: {e.message} (line {e.lineno})"
            ) from None
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        # A template that never mentions tool_calls would drop an assistant's past calls silently;
        # for those the calls are written into the message's text instead (see _tool_calls_text).
        self.renders_tool_calls = "tool_calls" in source
        self.accepts_tools = "tools" in source.replace("tool_calls", "")  # reads a `tools` list

    @classmethod
    def from_directory(cls, directory: str | Path) -> ChatTemplate | None:
        """The model's template, or None when it has none."""
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise ChatTemplateError(f"{config_path} is not valid JSON: {e}") from None
        jinja_file = directory / "chat_template.jinja"
        if config.get("chat_template") is None and jinja_file.is_file():
            config = {**config, "chat_template": jinja_file.read_text(encoding="utf-8")}
        return cls.from_config(config)

    @classmethod
    def from_config(cls, config: dict) -> ChatTemplate | None:
        """The template of a tokenizer_config.json's content (a GGUF's metadata gives one too)."""
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source.strip():
            return None
        return cls(source, bos_token=_token_text(config.get("bos_token")),
                   eos_token=_token_text(config.get("eos_token")))

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, **extra) -> str:
        """Prompt text for messages [{"role": ..., "content": ...}, ...]."""
        checked = [_check_message(i, m, self.renders_tool_calls) for i, m in enumerate(messages)]
        if not checked:
            raise ChatTemplateError("messages must not be empty")
        try:
            return self.template.render(messages=checked, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the model's chat template refused these messages: {e}") from None


def _check_message(index: int, message, renders_tool_calls: bool = True) -> dict:
    """A message with its content as plain text (text parts joined), or a clear error. An
    assistant's tool_calls are checked, and appended to its text when the template cannot show them."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ChatTemplateError(f"{where} must be an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ChatTemplateError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            is_text = isinstance(part, dict) and part.get("type") == "text"
            if not (is_text and isinstance(part.get("text"), str)):
                raise ChatTemplateError(f"{where}.content[{j}] must be a text part {{type: text, text}}; "
                                        "this model reads text only")
            texts.append(part["text"])
        content = "".join(texts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise ChatTemplateError(f"{where}.content must be a string or a list of text parts")
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise ChatTemplateError(f"{where}.tool_calls is only allowed on assistant messages")
        text = _tool_calls_text(where, calls)
        if calls and not renders_tool_calls:
            content = f"{content}\n{text}" if content else text
    return {**message, "content": content}


def _tool_calls_text(where: str, calls) -> str:
    """Check OpenAI-shaped calls [{id, type: function, function: {name, arguments: JSON string}}]
    and write them as llama.cpp's generic format does for templates without tool support:
    {"tool_calls": [{"name": ..., "arguments": {...}, "id": ...}]}."""
    if not isinstance(calls, list):
        raise ChatTemplateError(f"{where}.tool_calls must be a list")
    written = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"{where}.tool_calls[{j}] must be "
                                    "{type: function, function: {name, arguments}}")
        try:
            arguments = json.loads(function.get("arguments", "{}"))
        except (TypeError, ValueError):
            arguments = None
        if not isinstance(arguments, dict):
            raise ChatTemplateError(f"{where}.tool_calls[{j}].function.arguments must be a JSON object "
                                    "written as a string")
        written.append({"name": function["name"], "arguments": arguments,
                        **({"id": call["id"]} if isinstance(call.get("id"), str) else {})})
    return json.dumps({"tool_calls": written}, ensure_ascii=False)
