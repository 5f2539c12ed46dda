"""Constrained decoding: the grammar stage keeps only tokens the schema allows, so 20 varied schemas
give outputs that parse and validate (jsonschema) even from a random tiny model; through the official
openai client with response_format; bad schemas are a 400 naming response_format."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import torch

from json_schemas import SCHEMAS
from nexttok.errors import InvalidParameter
from nexttok.generation.grammar import Constraint
from nexttok.generation.loop import stream
from nexttok.generation.sampling import SamplerChain, SamplingParams


@pytest.fixture(scope="module")
def client(tiny_live):
    server, served = tiny_live
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0), served


def test_the_stage_masks_exactly_what_the_grammar_allows(tiny_live):
    _, served = tiny_live
    model, tokenizer = served.model, served.tokenizer
    vocab, stops = model.config.vocab_size, model.config.eos_token_id
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    constraint = Constraint.json_schema(tokenizer, vocab, schema, stops)
    logits = torch.zeros(vocab)
    allowed = constraint.apply(logits) > float("-inf")
    texts = {tokenizer.decode([i]) for i in allowed.nonzero().flatten().tolist()}
    assert texts and all('{"ok": '.startswith(t) for t in texts)  # only prefixes of the one valid start
    for token in tokenizer.encode('{"ok": true}'):
        assert constraint.apply(logits)[token] == 0
        constraint.accept(token)
    final = constraint.apply(logits) > float("-inf")
    assert final.nonzero().flatten().tolist() == stops  # the document is complete: only the stop token
    with pytest.raises(ValueError, match="not allowed by the grammar"):
        Constraint.json_schema(tokenizer, vocab, schema, stops).accept(tokenizer.encode("x")[0])


def test_grammar_is_the_first_recorded_stage(tiny_live):
    _, served = tiny_live
    model, tokenizer = served.model, served.tokenizer
    constraint = Constraint.json_object(tokenizer, model.config.vocab_size, model.config.eos_token_id)
    chain = SamplerChain.from_params(SamplingParams(temperature=0.7, top_k=5), model.config.vocab_size,
                                     constraint=constraint)
    records = chain.sample(torch.randn(model.config.vocab_size), record=True).stages
    assert [r.name for r in records] == ["raw", "grammar", "top_k", "temperature"]
    assert records[1].kept < records[0].kept and records[2].kept <= 5
    starts = {tokenizer.decode([i]) for i in records[-1].top_ids if records[-1].top_probs[records[-1].top_ids.index(i)]}
    assert starts and all(text.lstrip().startswith("{") for text in starts)  # json_object: an object first


@pytest.mark.parametrize("name, prompt, schema", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_twenty_schemas_validate_from_a_random_model(tiny_live, name, prompt, schema):
    _, served = tiny_live
    model, tokenizer = served.model, served.tokenizer
    constraint = Constraint.json_schema(tokenizer, model.config.vocab_size, schema, model.config.eos_token_id)
    steps = list(stream(model, tokenizer, prompt, SamplingParams(temperature=0.7, seed=1), max_tokens=400,
                        constraint=constraint))
    assert steps[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(s.text for s in steps)), schema)


def test_response_format_through_the_openai_client(client):
    openai_client, _ = client
    name, prompt, schema = SCHEMAS[7]  # patterns, nested array of objects
    for stream_it in (False, True):
        kwargs = dict(model="tiny", messages=[{"role": "user", "content": prompt}], temperature=0.7, seed=3,
                      max_tokens=300, response_format={"type": "json_schema",
                                                       "json_schema": {"name": name, "schema": schema,
                                                                       "strict": True}})
        if stream_it:
            text = "".join(c.choices[0].delta.content or "" for c in openai_client.chat.completions.create(
                stream=True, **kwargs))
        else:
            text = openai_client.chat.completions.create(**kwargs).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)
    name, prompt, schema = SCHEMAS[2]  # enums
    done = openai_client.completions.create(
        model="tiny", prompt=prompt, max_tokens=200, temperature=1, seed=2, n=2,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}})
    for choice in done.choices:  # each choice has its own grammar state
        jsonschema.validate(json.loads(choice.text), schema)


def test_bad_schemas_are_a_400_naming_response_format(client):
    openai_client, _ = client
    for response_format in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
                            {"type": "json_schema"}, {"type": "xml"}):
        with pytest.raises(openai.BadRequestError) as caught:
            openai_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  response_format=response_format)
        assert caught.value.body["param"].startswith("response_format"), caught.value.body


def test_library_errors_name_the_parameter(tiny_live):
    _, served = tiny_live
    with pytest.raises(InvalidParameter, match="cannot be compiled") as caught:
        Constraint.json_schema(served.tokenizer, served.model.config.vocab_size, {"type": 3}, [0], "json_schema")
    assert caught.value.param == "json_schema"


@pytest.mark.parametrize("variant", ["llama2", "mistral", "gemma"])
def test_sentencepiece_vocabularies_walk_a_schema(spm_variant_files, variant):
    """A SentencePiece-style tokenizer puts "▁" before a text's first word: the grammar engine must
    still see each token's bytes mid-text and get continuation ids for text it forces."""
    from nexttok.tokenizers.from_json import tokenizer_from_json

    tokenizer = tokenizer_from_json(json.loads(spm_variant_files[variant].read_text(encoding="utf-8")))
    stop = tokenizer.vocab_size - 1
    schema = {"type": "object", "properties": {"name": {"type": "string", "enum": ["Alice Smith", "Bob"]}},
              "required": ["name"], "additionalProperties": False}
    constraint = Constraint.json_schema(tokenizer, tokenizer.vocab_size, schema, [stop])
    logits, chosen = torch.zeros(tokenizer.vocab_size), []
    while not chosen or chosen[-1] != stop:  # the longest allowed token each time: a walk to the end
        allowed = (constraint.apply(logits) > float("-inf")).nonzero().flatten().tolist()
        chosen.append(max(allowed, key=lambda i: (len(tokenizer.decode_bytes([i])), -i)))
        constraint.accept(chosen[-1])
        assert len(chosen) < 60
    assert json.loads(tokenizer.decode_bytes(chosen[:-1]).decode()) in ({"name": "Alice Smith"}, {"name": "Bob"})
