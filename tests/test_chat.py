"""Chat templates rendered exactly as HF transformers renders them."""

from __future__ import annotations

import json

import pytest

from nexttok.chat import ChatTemplate, ChatTemplateError

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

    from nexttok.loading import load_checkpoint

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
