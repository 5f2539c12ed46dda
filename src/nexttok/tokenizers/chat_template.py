"""Chat templates: messages → prompt text, with the model's own Jinja template.

The template comes from tokenizer_config.json ("chat_template", a string or a list of named
templates) or a chat_template.jinja file beside it, and runs in jinja2's immutable sandbox set up
as HF transformers' apply_chat_template sets up its own (utils/chat_template_utils.py): trim_blocks
and lstrip_blocks, loop controls, the {% generation %} block, raise_exception, strftime_now, a
tojson that neither escapes HTML nor sorts keys, and dict / namespace that refuse private names.
The messages reach it as HF hands them over too: keys whose value is None dropped, a reasoning
given as reasoning_content, thinking or reasoning readable under both reasoning_content and
thinking (Qwen3 and GLM read the one, gpt-oss the other), tools and documents None when not given.
Past tool calls' arguments are handed over as the template can show them: a JSON object where
it only shows objects (gpt-oss, Qwen3-Coder, GLM-4.5, Mistral), as sent otherwise.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """No template, a template that does not compile, or messages it refuses."""


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters and sorts keys, which would change prompts
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: HF marks the assistant's text with it (for training
    masks); rendering, it is its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateDict:
    """dict() and dict.fromkeys() without the type's other attributes (as HF's)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore names (as HF's), so no template reaches Python's internals."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the underscore name {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _token_text(value) -> str:
    """bos/eos in tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


# the special tokens HF hands every template (those the tokenizer has), beside bos/eos
OTHER_SPECIAL_TOKENS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# a message's reasoning under the names clients send it; HF reads the first not null of these
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# OpenAI's harmony format (gpt-oss): a reply ends in <|return|> (done) or <|call|> (a tool call);
# <|end|> only closes a message, e.g. the analysis channel before the final one
HARMONY_STOPS = ("<|return|>", "<|call|>", "<|endoftext|>")
# the probe llama.cpp (minja) renders to learn how a template shows a past call's arguments
_PROBE_ARGUMENTS = {"argument_needle": "print('Hello, World!')"}


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 special_tokens: dict[str, str] | None = None):
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template does not compile: {e.message} (line {e.lineno})"
            ) from None
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        self.special_tokens = {**(special_tokens or {}), "bos_token": bos_token, "eos_token": eos_token}
        # A template that never mentions tool_calls would drop an assistant's past calls silently;
        # for those the calls are written into the message's text instead (see _tool_calls_text).
        self.renders_tool_calls = "tool_calls" in source
        self.accepts_tools = "tools" in source.replace("tool_calls", "")  # reads a `tools` list
        self.arguments_shape = self._arguments_shape() if self.renders_tool_calls else None

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """The tokens that end the model's reply under this template, to stop on beside the
        checkpoint's eos ids: its eos_token, and for harmony (gpt-oss) <|return|>, <|call|> and
        <|endoftext|> but never <|end|>, which closes the analysis channel inside one reply (as
        llama.cpp, which drops <|end|> from its end-of-generation tokens when <|return|> and
        <|call|> exist)."""
        texts = [self.eos_token] if self.eos_token else []
        if all(t in self.source for t in ("<|channel|>", "<|return|>", "<|call|>")):
            texts += [t for t in HARMONY_STOPS if t not in texts]
        return tuple(t for t in texts if t != "<|end|>" or "<|return|>" not in texts)

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
        others = {name: _token_text(config.get(name)) for name in OTHER_SPECIAL_TOKENS}
        return cls(source, bos_token=_token_text(config.get("bos_token")),
                   eos_token=_token_text(config.get("eos_token")),
                   special_tokens={name: text for name, text in others.items() if text})

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, **extra) -> str:
        """Prompt text for messages [{"role": ..., "content": ...}, ...]; extra: more variables
        for the template (tools, reasoning_effort, enable_thinking, ...)."""
        checked = [_check_message(i, m, self.renders_tool_calls, self.arguments_shape)
                   for i, m in enumerate(messages)]
        if not checked:
            raise ChatTemplateError("messages must not be empty")
        try:
            return self._render(checked, add_generation_prompt, extra)
        except jinja2.TemplateError as e:  # raise_exception's message, an undefined name, the sandbox
            raise ChatTemplateError(f"the model's chat template refused these messages: {_one_line(e)}") from None
        except Exception as e:  # a template's own bug (a filter on the wrong type, ...)
            raise ChatTemplateError(f"the model's chat template failed on these messages: "
                                    f"{type(e).__name__}: {_one_line(e)}") from None

    def _render(self, messages: list[dict], add_generation_prompt: bool, extra: dict) -> str:
        # HF: render(messages, tools, documents, add_generation_prompt, **special tokens, **kwargs)
        variables = {**self.special_tokens, "tools": None, "documents": None, **extra}
        return self.template.render(**variables, messages=messages, add_generation_prompt=add_generation_prompt)

    def _arguments_shape(self) -> str | None:
        """"object" when the template shows a past call's arguments only given as a JSON object
        (gpt-oss's |tojson, Qwen3-Coder's |items, GLM's .items()), "string" when only as the JSON
        text OpenAI sends, None when either works (or neither: the template refused the probe)."""
        def shows(arguments) -> bool:
            call = {"id": "call_1___", "type": "function", "function": {"name": "ipython", "arguments": arguments}}
            probe = [{"role": "user", "content": "Hey"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
            try:
                text = self._render(probe, False, {})
            except Exception:  # a template that refuses the probe says nothing
                return False
            # shown as JSON or XML-ish keys, not JSON text quoted again, nor a Python dict's repr
            return "argument_needle" in text and '\\"argument_needle' not in text and "'argument_needle'" not in text

        as_text, as_object = shows(json.dumps(_PROBE_ARGUMENTS)), shows(_PROBE_ARGUMENTS)
        if as_object and not as_text:
            return "object"
        if as_text and not as_object:
            return "string"
        return None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split("\n"))


def _check_message(index: int, message, renders_tool_calls: bool = True, arguments_shape: str | None = None) -> dict:
    """A message as HF hands it to a template: its keys that are not None, content as plain text
    (text parts joined; an assistant's missing content ""), its reasoning under both
    reasoning_content and thinking; or a clear error. An assistant's tool_calls are checked, their
    arguments given in the shape the template shows (arguments_shape), and appended to its text
    when the template cannot show them."""
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
    checked = {key: value for key, value in message.items() if value is not None}
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise ChatTemplateError(f"{where}.tool_calls is only allowed on assistant messages")
        arguments = _tool_call_arguments(where, calls)
        if calls and not renders_tool_calls:
            text = _tool_calls_text(calls, arguments)
            content = f"{content}\n{text}" if content else text
        elif arguments_shape is not None:
            checked["tool_calls"] = [_with_arguments(call, given, arguments_shape)
                                     for call, given in zip(calls, arguments, strict=True)]
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise ChatTemplateError(f"{where}'s reasoning ({'/'.join(REASONING_FIELDS)}) must be a string")
        checked = {"thinking": reasoning, **checked, "reasoning_content": reasoning}
    return {**checked, "content": content}


def _tool_call_arguments(where: str, calls) -> list[dict]:
    """The arguments of OpenAI-shaped calls [{id, type: function, function: {name, arguments}}],
    checked: a JSON object written as a string (as OpenAI sends it) or the object itself (as HF takes it)."""
    if not isinstance(calls, list):
        raise ChatTemplateError(f"{where}.tool_calls must be a list")
    parsed = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"{where}.tool_calls[{j}] must be "
                                    "{type: function, function: {name, arguments}}")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, dict):
            try:
                arguments = json.loads(arguments)
            except (TypeError, ValueError):
                arguments = None
        if not isinstance(arguments, dict):
            raise ChatTemplateError(f"{where}.tool_calls[{j}].function.arguments must be a JSON object "
                                    "written as a string")
        parsed.append(arguments)
    return parsed


def _with_arguments(call: dict, arguments: dict, shape: str) -> dict:
    """The call with its arguments as the object (shape "object") or as JSON text ("string"),
    left as sent when they already are."""
    given = call["function"].get("arguments")
    wanted = arguments if shape == "object" else given if isinstance(given, str) else \
        json.dumps(arguments, ensure_ascii=False)
    return {**call, "function": {**call["function"], "arguments": wanted}}


def _tool_calls_text(calls: list, arguments: list[dict]) -> str:
    """The calls as llama.cpp's generic format writes them for templates without tool support:
    {"tool_calls": [{"name": ..., "arguments": {...}, "id": ...}]}."""
    written = [{"name": call["function"]["name"], "arguments": given,
                **({"id": call["id"]} if isinstance(call.get("id"), str) else {})}
               for call, given in zip(calls, arguments, strict=True)]
    return json.dumps({"tool_calls": written}, ensure_ascii=False)
