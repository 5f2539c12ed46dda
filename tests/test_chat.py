"""Chat templates rendered exactly as HF transformers renders them."""

from __future__ import annotations

import json
import re

import pytest

from nexttok.tokenizers.chat_template import ChatTemplate, ChatTemplateError

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{% if loop.index0 == 0 and message['role'] != 'system' %}"
          "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nBe brief.<|eot_id|>' }}{% endif %}"
          "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
          " + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
STRICT = ("{% for m in messages if m['role'] != 'system' %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
          "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi  "},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2? {json} <b>"}],
]


def _hf_tokenizer(tmp_path, template):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(path))
    return PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<s>", eos_token="</s>",
                                   chat_template=template)


@pytest.mark.parametrize("template", [CHATML, LLAMA3, STRICT], ids=["chatml", "llama3", "strict"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "four"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_transformers(tmp_path, template, conversation, add_generation_prompt):
    hf = _hf_tokenizer(tmp_path, template)
    expected = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    ours = ChatTemplate(template, bos_token="<s>", eos_token="</s>")
    assert ours.render(conversation, add_generation_prompt=add_generation_prompt) == expected


def test_default_model_template_matches_transformers(converted_default):
    from transformers import AutoTokenizer

    from nexttok.checkpoints.loading import load_checkpoint

    hf = AutoTokenizer.from_pretrained(converted_default)
    template = ChatTemplate.from_directory(converted_default)
    from_gguf = load_checkpoint("default").chat_template
    assert from_gguf is not None and from_gguf.source == template.source
    for conversation in CONVERSATIONS:
        expected = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert template.render(conversation) == expected
    assert template.render(CONVERSATIONS[0]).startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_text_parts_are_joined():
    template = ChatTemplate(CHATML)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert template.render(parts) == template.render([{"role": "user", "content": "ab"}])


@pytest.mark.parametrize("messages,message", [
    ([], "messages must not be empty"),
    (["hi"], "messages\\[0\\] must be an object"),
    ([{"role": "wizard", "content": "x"}], "messages\\[0\\].role must be one of"),
    ([{"role": "user", "content": 5}], "messages\\[0\\].content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content\\[0\\] must be a text part"),
])
def test_bad_messages(messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(CHATML).render(messages)


def test_template_refusal_and_syntax_errors():
    with pytest.raises(ChatTemplateError, match="refused these messages: Conversation roles must alternate"):
        ChatTemplate(STRICT).render([{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_sandbox_blocks_python_internals():
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        ChatTemplate(evil).render([{"role": "user", "content": "x"}])


def test_from_directory(tmp_path):
    assert ChatTemplate.from_directory(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": "x"}],
         "eos_token": {"content": "</s>"}}))
    template = ChatTemplate.from_directory(tmp_path)
    assert template.eos_token == "</s>" and template.source == CHATML
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text(LLAMA3)
    assert ChatTemplate.from_directory(tmp_path).source == LLAMA3


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_TURN = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_past_tool_calls_are_not_dropped_by_a_template_without_tools():
    """A user found the call silently missing from the prompt: the template never reads tool_calls.
    Now the call is written into the assistant's text (llama.cpp's generic format)."""
    text = ChatTemplate(CHATML).render(TOOL_TURN)
    expected = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}]})
    assert f"<|im_start|>assistant\n{expected}<|im_end|>" in text
    assert "<|im_start|>tool\n18 C, sunny<|im_end|>" in text


def test_a_template_with_tools_gets_the_calls_as_they_are():
    source = ("{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}"
              "[call {{ c.function.name }} {{ c.function.arguments }}]{% endfor %}\n{% endfor %}")
    text = ChatTemplate(source).render(TOOL_TURN)
    assert 'assistant:[call get_weather {"city": "Paris"}]' in text and "tool_calls" not in text


@pytest.mark.parametrize(("message", "error"), [
    ({"role": "user", "content": "x", "tool_calls": [CALL]}, "messages[0].tool_calls is only allowed on assistant"),
    ({"role": "assistant", "content": "", "tool_calls": {"a": 1}}, "messages[0].tool_calls must be a list"),
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}, "messages[0].tool_calls[0] must be"),
    ({"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{oops"}}]},
     "messages[0].tool_calls[0].function.arguments must be a JSON object"),
    ({"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]},
     "messages[0].tool_calls[0].function.arguments must be a JSON object"),
])
def test_bad_tool_calls_say_what_is_wrong(message, error):
    with pytest.raises(ChatTemplateError, match=re.escape(error)):
        ChatTemplate(CHATML).render([message])
