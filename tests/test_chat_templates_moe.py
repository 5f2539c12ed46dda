"""The MoE families' own chat templates (gpt-oss's harmony, Qwen3 / Qwen3-Coder, GLM-4.5/4.6,
Granite 3.3 / 4.0, Mistral's) rendered by our engine exactly as HF transformers' apply_chat_template
renders them: system and user turns, a conversation, past tool calls and their results with a
tools list, reasoning, the templates' own variables (reasoning_effort, enable_thinking, ...).

The templates are llama.cpp's copies (models/templates, MIT), kept in tests/templates/. Both
engines read the date through strftime_now; the tests pin it on both sides.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
from pathlib import Path

import pytest

from nexttok.tokenizers import chat_template as chat_template_module
from nexttok.tokenizers.chat_template import ChatTemplate, ChatTemplateError

TEMPLATES = Path(__file__).parent / "templates"
# file -> (bos_token, eos_token) as the model's tokenizer_config.json gives them
SPECIAL = {
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "Qwen3-Coder.jinja": ("", "<|im_end|>"),
    "GLM-4.6.jinja": ("", "<|endoftext|>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "ibm-granite-granite-4.0.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
}
TODAY = dt.datetime(2026, 3, 7, 9, 30)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C) <b>&</b>",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "default": 5},
        "tags": {"type": "array", "items": {"type": "string"}}, "strict": {"type": "boolean"}},
        "required": ["query"]}}}
ARGUMENTS = {"city": "Zürich", "unit": "celsius"}
SYSTEM = {"role": "system", "content": "You are terse."}
ASK = {"role": "user", "content": "What's the weather in Zürich? <b>"}
CHAT = [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, ASK]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call12345", "type": "function",  # Mistral wants 9-character ids
     "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS, ensure_ascii=False)}}]}
RESULT = {"role": "tool", "tool_call_id": "call12345", "content": '{"celsius": 18, "sky": "sunny"}'}
ANSWER = {"role": "assistant", "content": "18 °C and sunny."}
THOUGHT = "The user wants the weather; call get_weather."

# (id, messages, apply_chat_template's other arguments); templates below say which they take
BASIC = [
    ("system+user", [SYSTEM, ASK], {"add_generation_prompt": True}),
    ("user", [ASK], {"add_generation_prompt": True}),
    ("conversation", CHAT, {"add_generation_prompt": True}),
    ("conversation-no-prompt", CHAT, {"add_generation_prompt": False}),
]
TOOLS = [
    ("tools-listed", [SYSTEM, ASK], {"tools": [WEATHER, SEARCH], "add_generation_prompt": True}),
    ("tools-one-no-system", [ASK], {"tools": [WEATHER], "add_generation_prompt": True}),
    ("tool-call+result", [SYSTEM, ASK, CALL, RESULT], {"tools": [WEATHER, SEARCH], "add_generation_prompt": True}),
    ("tool-call+result+answer", [SYSTEM, ASK, CALL, RESULT, ANSWER],
     {"tools": [WEATHER, SEARCH], "add_generation_prompt": False}),
]
THINKING_CALL = {**CALL, "reasoning_content": THOUGHT}
CASES = {
    "openai-gpt-oss-120b.jinja": BASIC + TOOLS + [
        ("reasoning-effort-high", [SYSTEM, ASK], {"reasoning_effort": "high", "add_generation_prompt": True}),
        ("reasoning-effort-low+tools", [ASK], {"reasoning_effort": "low", "tools": [SEARCH],
                                               "add_generation_prompt": True}),
        ("model-identity+builtin-tools", [ASK], {"model_identity": "You are a weather bot.",
                                                 "builtin_tools": ["browser", "python"], "add_generation_prompt": True}),
        ("thinking-final-turn", [ASK, {**ANSWER, "thinking": THOUGHT}], {"add_generation_prompt": False}),
        ("thinking-dropped-in-past-turn", [ASK, {**ANSWER, "thinking": THOUGHT}, ASK], {"add_generation_prompt": True}),
        ("thinking-on-tool-call", [SYSTEM, ASK, {**CALL, "thinking": THOUGHT}, RESULT],
         {"tools": [WEATHER], "add_generation_prompt": True}),
        ("reasoning-content-on-tool-call", [ASK, THINKING_CALL, RESULT], {"tools": [WEATHER],
                                                                          "add_generation_prompt": True}),
        ("developer-message", [{"role": "developer", "content": "Answer in French."}, ASK],
         {"add_generation_prompt": True}),
    ],
    "Qwen-Qwen3-0.6B.jinja": BASIC + TOOLS + [
        ("enable-thinking-false", [SYSTEM, ASK], {"enable_thinking": False, "add_generation_prompt": True}),
        ("reasoning-content-after-last-query", [SYSTEM, ASK, THINKING_CALL, RESULT],
         {"tools": [WEATHER], "add_generation_prompt": True}),
        ("reasoning-in-past-turn", [ASK, {**ANSWER, "reasoning_content": THOUGHT}, ASK], {"add_generation_prompt": True}),
        ("reasoning-final-turn", [ASK, {**ANSWER, "reasoning": THOUGHT}], {"add_generation_prompt": False}),
    ],
    "Qwen3-Coder.jinja": BASIC + TOOLS,
    "GLM-4.6.jinja": BASIC + TOOLS + [
        ("enable-thinking-false", [SYSTEM, ASK], {"enable_thinking": False, "add_generation_prompt": True}),
        ("reasoning-content-after-last-user", [SYSTEM, ASK, THINKING_CALL, RESULT],
         {"tools": [WEATHER], "add_generation_prompt": True}),
        ("reasoning-final-turn", [ASK, {**ANSWER, "thinking": THOUGHT}], {"add_generation_prompt": False}),
    ],
    "ibm-granite-granite-3.3-2B-Instruct.jinja": BASIC + TOOLS + [
        ("thinking-variable", [ASK], {"thinking": True, "add_generation_prompt": True}),
        ("documents", [ASK], {"documents": [{"doc_id": 1, "text": "Zürich is in Switzerland."}],
                              "add_generation_prompt": True}),
    ],
    "ibm-granite-granite-4.0.jinja": BASIC + TOOLS + [
        ("documents", [ASK], {"documents": [{"doc_id": 1, "text": "Zürich is in Switzerland."}],
                              "add_generation_prompt": True}),
    ],
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": BASIC + TOOLS,
}
PARAMS = [pytest.param(name, messages, extra, id=f"{name.removesuffix('.jinja')}-{case}")
          for name, cases in CASES.items() for case, messages, extra in cases]


@pytest.fixture(autouse=True)
def pinned_date(monkeypatch):
    """strftime_now on both sides reads datetime.now() from its module: both see TODAY."""
    import transformers.utils.chat_template_utils as hf_utils

    class Pinned(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(TODAY.year, TODAY.month, TODAY.day, TODAY.hour, TODAY.minute)

    monkeypatch.setattr(hf_utils, "datetime", Pinned)
    monkeypatch.setattr(chat_template_module, "datetime", Pinned)


@functools.cache
def _source(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


@functools.cache
def _hf(name: str):
    """HF's renderer for the template alone: a tokenizer with an empty BPE model, no checkpoint."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    bos, eos = SPECIAL[name]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token=bos or None,
                                   eos_token=eos, chat_template=_source(name))


def _ours(name: str) -> ChatTemplate:
    bos, eos = SPECIAL[name]
    return ChatTemplate(_source(name), bos_token=bos, eos_token=eos)


def _as_hf_takes_them(messages: list[dict], generic_calls: bool) -> list[dict]:
    """The messages as HF's documentation passes them: a call's arguments as an object, an
    assistant's content "" beside its calls (HF drops a None content, and Qwen3's template then
    fails on it; we read None as ""). generic_calls: the template cannot show calls, and we write
    them into the content as llama.cpp's generic format does, where HF drops them."""
    out = []
    for message in copy.deepcopy(messages):
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            if generic_calls:
                message["content"] = json.dumps({"tool_calls": [
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"], "id": c["id"]}
                    for c in message.pop("tool_calls")]}, ensure_ascii=False)
            elif message["content"] is None:
                message["content"] = ""
        out.append(message)
    return out


@pytest.mark.parametrize(("name", "messages", "extra"), PARAMS)
def test_renders_as_transformers(name, messages, extra):
    ours = _ours(name)
    hf_messages = _as_hf_takes_them(messages, generic_calls=not ours.renders_tool_calls)
    expected = _hf(name).apply_chat_template(hf_messages, tokenize=False, **extra)
    # as an OpenAI client sends them (arguments as JSON text, content None) and as HF takes them
    assert ours.render(copy.deepcopy(messages), **extra) == expected
    assert ours.render(_as_hf_takes_them(messages, generic_calls=False), **extra) == expected


def test_the_pinned_date_reaches_both_engines():
    expected = _hf("openai-gpt-oss-120b.jinja").apply_chat_template([ASK], tokenize=False)
    assert "Current date: 2026-03-07\n" in expected
    granite = _ours("ibm-granite-granite-3.3-2B-Instruct.jinja").render([ASK])
    assert "Today's Date: March 07, 2026." in granite


def test_gpt_oss_harmony_format():
    ours = _ours("openai-gpt-oss-120b.jinja")
    text = ours.render([SYSTEM, ASK, CALL, RESULT], tools=[WEATHER], reasoning_effort="high")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                           "Knowledge cutoff: 2024-06\nCurrent date: 2026-03-07\n\nReasoning: high\n\n"
                           "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
                           "Calls to these tools must go to the commentary channel: 'functions'.<|end|>")
    assert ("<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n# Tools\n\n## functions\n\n"
            "namespace functions {\n\n// Current weather in a city (°C) <b>&</b>\ntype get_weather = (_: {\n"
            "// City name, e.g. Zürich\ncity: string,\nunit?: \"celsius\" | \"fahrenheit\", // default: celsius,\n"
            "}) => any;\n\n} // namespace functions<|end|>") in text
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Zürich", "unit": "celsius"}<|call|>') in text
    assert ('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
            '"{\\"celsius\\": 18, \\"sky\\": \\"sunny\\"}"<|end|>') in text
    assert text.endswith("<|start|>assistant")
    assert "Reasoning: medium\n" in ours.render([ASK])


def test_arguments_shape_follows_what_the_template_shows():
    assert _ours("openai-gpt-oss-120b.jinja").arguments_shape == "object"  # |tojson
    assert _ours("Qwen3-Coder.jinja").arguments_shape == "object"  # |items
    assert _ours("GLM-4.6.jinja").arguments_shape == "object"  # .items(), raises on text
    assert _ours("mistralai-Mistral-Nemo-Instruct-2407.jinja").arguments_shape == "object"
    assert _ours("Qwen-Qwen3-0.6B.jinja").arguments_shape is None  # `is string` picks either
    as_text = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}"
                           "{% endfor %}{% endfor %}")
    assert as_text.arguments_shape == "string"
    given_object = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": "é"}}}]}]
    assert as_text.render(given_object) == '{"a": "é"}'


def test_harmony_stops_on_return_and_call_not_end():
    assert _ours("openai-gpt-oss-120b.jinja").stop_texts == ("<|return|>", "<|call|>", "<|endoftext|>")
    assert "<|end|>" not in _ours("openai-gpt-oss-120b.jinja").stop_texts
    assert _ours("Qwen-Qwen3-0.6B.jinja").stop_texts == ("<|im_end|>",)
    assert ChatTemplate("{{ messages[0].content }}").stop_texts == ()


@pytest.mark.parametrize(("name", "messages", "message"), [
    ("openai-gpt-oss-120b.jinja", [ASK, {"role": "assistant", "content": "<|channel|>final<|message|>hi"}],
     "You have passed a message containing <|channel|> tags in the content field."),
    ("openai-gpt-oss-120b.jinja", [ASK, RESULT], "Message has tool role, but there was no previous assistant"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", [ASK, ASK], "conversation roles must alternate"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", [ASK, {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "c1"}]}],
     "Tool call IDs should be alphanumeric strings with length 9!"),
])
def test_a_template_refusal_is_one_line_with_its_message(name, messages, message):
    with pytest.raises(ChatTemplateError) as refused:
        _ours(name).render(messages, add_generation_prompt=False)
    text = str(refused.value)
    assert text.startswith("the model's chat template refused these messages: ") and message in text
    assert "\n" not in text
    with pytest.raises(Exception) as hf_refused:  # HF refuses the same messages
        _hf(name).apply_chat_template(_as_hf_takes_them(messages, False), tokenize=False)
    assert message in str(hf_refused.value)


def test_a_template_bug_is_one_line_too():
    broken = ChatTemplate("{% for k, v in messages[0].content | items %}{{ k }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="^the model's chat template failed on these messages: TypeError: "):
        broken.render([ASK])


def test_environment_as_hf_sets_it_up():
    generation = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    assert generation.render([ASK, ANSWER]) == f"[{ASK['content']}][{ANSWER['content']}]"
    tojson = ChatTemplate("{{ messages[0] | tojson }}|{{ {'b': 1, 'a': '<é>'} | tojson(indent=2) }}")
    assert tojson.render([ASK]) == json.dumps(ASK, ensure_ascii=False) + '|{\n  "b": 1,\n  "a": "<é>"\n}'
    loops = ChatTemplate("{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
                         "{{ dict(a=1) | tojson }}{% set ns = namespace(n=2) %}{{ ns.n }}{{ tools is none }}")
    assert loops.render([ASK, ANSWER]) == 'user{"a": 1}2True'
    for evil in ("{% set ns = namespace(_x=1) %}", "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
                 "{{ dict.__class__.__mro__ }}", "{{ namespace.__init__.__globals__ }}"):
        with pytest.raises(ChatTemplateError):
            ChatTemplate(evil).render([ASK])


def test_none_values_are_dropped_and_reasoning_aliased_as_hf_does():
    seen = ChatTemplate("{% for m in messages %}{{ m | tojson }}\n{% endfor %}")
    text = seen.render([{"role": "user", "content": "x", "name": None},
                        {"role": "assistant", "content": "y", "reasoning": "r", "tool_calls": None}])
    assert text.splitlines() == ['{"role": "user", "content": "x"}',
                                 '{"thinking": "r", "role": "assistant", "content": "y", "reasoning": "r", '
                                 '"reasoning_content": "r"}']
    with pytest.raises(ChatTemplateError, match="reasoning"):
        seen.render([{"role": "assistant", "content": "y", "thinking": ["r"]}])


def test_from_config_hands_the_other_special_tokens():
    template = ChatTemplate.from_config({"chat_template": "{{ pad_token }}|{{ unk_token is defined }}",
                                         "pad_token": {"content": "<pad>"}, "eos_token": "</s>"})
    assert template.render([ASK]) == "<pad>|False"
