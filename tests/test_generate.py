"""The generation loop: HF greedy parity, seeds, stops, UTF-8 streaming, limits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nexttok.checkpoints.loading import load_model
from nexttok.errors import InvalidParameter
from nexttok.generation.loop import Generation, StopStrings, generate, stream
from nexttok.generation.sampling import SamplingParams
from nexttok.models.config import ModelConfig
from nexttok.tokenizers.tokenizer import bytes_to_unicode
from tiny_models import write_tiny

GREEDY = SamplingParams(temperature=0)


class ScriptedModel(torch.nn.Module):
    """A stand-in model that always makes the next token of a script overwhelmingly likely."""

    def __init__(self, script: list[int], prompt_len: int, vocab: int = 50257, context: int = 1024):
        super().__init__()
        self.config = ModelConfig(model_type="gpt2", vocab_size=vocab, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, intermediate_size=8,
                                  max_position_embeddings=context, eos_token_id=[50256])
        self.script, self.prompt_len = script, prompt_len
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids, cache=None, positions=None, last_only=False):
        if cache is not None:
            cache.append_positions(torch.arange(cache.offset, cache.offset + ids.shape[1])[None])
            seen = cache.offset
        else:
            seen = ids.shape[1]
        logits = torch.zeros(1, ids.shape[1], self.config.vocab_size)
        step = seen - self.prompt_len
        logits[0, -1, self.script[step] if step < len(self.script) else 0] = 30.0
        return logits


def _byte_tokens(gpt2, text: str) -> list[int]:
    table = bytes_to_unicode()
    return [gpt2.token_to_id(table[b]) for b in text.encode()]


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa_llama3_rope", "qwen2_sliding", "mistral"])
def tiny(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = write_tiny(request.param, directory)
    return hf, load_model(directory)


def test_greedy_matches_hf_generate(tiny, gpt2):
    hf, ours = tiny
    prompt = [3, 17, 42, 99, 5]
    expected = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    got = generate(ours, gpt2, prompt, GREEDY, max_tokens=24, stop_token_ids=[])
    assert got.token_ids == expected
    assert got.finish_reason == "length" and got.completion_tokens == 24


EVERY_STAGE = {
    "classic": SamplingParams(temperature=1.1, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.2, seed=42),
    "dry+xtc+typical+sigma+dynatemp": SamplingParams(
        temperature=1.1, dynatemp_range=0.4, top_k=40, top_n_sigma=2.5, typical_p=0.95, min_p=0.02,
        xtc_probability=0.5, xtc_threshold=0.1, dry_multiplier=0.8, dry_allowed_length=1, repetition_penalty=1.1,
        presence_penalty=0.3, repeat_last_n=16, seed=42),
    "mirostat1": SamplingParams(temperature=0.9, mirostat=1, mirostat_tau=4.0, seed=42),
    "mirostat2": SamplingParams(temperature=0.9, mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2, seed=42),
}


@pytest.mark.parametrize("name", EVERY_STAGE)
def test_every_stage_seeded_repeats_bit_for_bit_with_and_without_cache(tiny, gpt2, name):
    """XTC's chances come from the draw's seeded stream and Mirostat's mu from the tokens taken, so a
    seed repeats the run exactly, whether the context goes through the KV cache or not; the seed
    alone changes the draws (every other setting kept), so the repeat is the seed's doing."""
    _, ours = tiny
    params = EVERY_STAGE[name]
    runs = [generate(ours, gpt2, [1, 2, 3], params, max_tokens=20, stop_token_ids=[], use_cache=c).token_ids
            for c in (True, True, False)]
    assert runs[0] == runs[1] == runs[2]
    other = generate(ours, gpt2, [1, 2, 3], dataclasses.replace(params, seed=43), max_tokens=20,
                     stop_token_ids=[]).token_ids
    assert other != runs[0]


def test_step_records(tiny, gpt2):
    hf, ours = tiny
    prompt = [7, 8, 9]
    steps = list(stream(ours, gpt2, prompt, SamplingParams(temperature=0.9, seed=1), max_tokens=3,
                        stop_token_ids=[], top_n=4))
    assert [s.index for s in steps] == [0, 1, 2] and steps[-1].finish_reason == "length"
    assert steps[0].prefill and not steps[1].prefill
    ids = prompt + [steps[0].token_id]
    with torch.no_grad():
        reference = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1].float(), -1)
    second = steps[1]
    assert second.logprob == pytest.approx(float(reference[second.token_id]), abs=1e-4)
    assert second.rank == int((reference > reference[second.token_id]).sum()) + 1
    assert [a.id for a in second.top] == torch.topk(reference, 4).indices.tolist()
    assert all(0 <= s.draw < 1 for s in steps)


def _run_script(gpt2, script, **options):
    prompt = gpt2.encode("Q:")
    model = ScriptedModel(script, len(prompt), **options.pop("model", {}))
    return list(stream(model, gpt2, prompt, GREEDY, **options))


def test_stop_string_split_across_tokens_never_leaks(gpt2):
    script = _byte_tokens(gpt2, "Hello world\n\nUser: more")
    steps = _run_script(gpt2, script, stop=["\n\nUser:"], max_tokens=100)
    assert "".join(s.text for s in steps) == "Hello world"
    assert steps[-1].finish_reason == "stop"
    assert all("\n" not in s.text for s in steps)
    assert steps[-1].index == len("Hello world\n\nUser:") - 1  # stopped on the token completing it


@settings(max_examples=60, deadline=None)
@given(before=st.text(max_size=12), stop=st.text(min_size=1, max_size=4), after=st.text(max_size=6),
       bytewise=st.booleans())
def test_stop_strings_any_text(gpt2, before, stop, after, bytewise):
    full = before + stop + after
    script = _byte_tokens(gpt2, full) if bytewise else gpt2.encode(full, allow_special=False)
    steps = _run_script(gpt2, script, stop=[stop], max_tokens=len(script) + 1)
    text = "".join(s.text for s in steps)
    assert text == full[: full.find(stop)]
    assert steps[-1].finish_reason == "stop"


def test_utf8_split_across_tokens_streams_whole_characters(gpt2):
    text = "naïve 日本 🎉👍🏽!"
    steps = _run_script(gpt2, _byte_tokens(gpt2, text), max_tokens=len(text.encode()))
    assert "".join(s.text for s in steps) == text
    assert all("\ufffd" not in s.text for s in steps)
    assert sum(1 for s in steps if s.text == "") > 5  # partial characters were held back
    assert steps[-1].finish_reason == "length"


def test_eos_stops_without_emitting_its_text(gpt2):
    script = [*gpt2.encode(" Paris."), 50256, *gpt2.encode(" never")]
    steps = _run_script(gpt2, script, max_tokens=50)
    assert "".join(s.text for s in steps) == " Paris."
    assert steps[-1].finish_reason == "stop" and steps[-1].token_id == 50256


def test_context_window_full_ends_with_length(gpt2):
    prompt_len = len(gpt2.encode("Q:"))
    steps = _run_script(gpt2, gpt2.encode(" a" * 50), max_tokens=None, model={"context": 12})
    assert len(steps) == 12 - prompt_len
    assert steps[-1].finish_reason == "length"


def test_held_text_is_released_at_the_end(gpt2):
    steps = _run_script(gpt2, gpt2.encode("answer: 42\n"), stop=["\n\n"], max_tokens=len(gpt2.encode("answer: 42\n")))
    assert "".join(s.text for s in steps) == "answer: 42\n"


def test_stop_strings_helper():
    held = StopStrings(["abc", "xy"])
    assert held.feed("1a") == ("1", False)
    assert held.feed("b") == ("", False)
    assert held.feed("d") == ("abd", False)
    assert held.feed("x") == ("", False)
    assert held.feed("yz") == ("", True)
    assert held.feed("q") == ("q", False)


def test_bad_arguments(gpt2, tiny):
    _, ours = tiny
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        generate(ours, gpt2, [1], max_tokens=0)
    with pytest.raises(ValueError, match="stop must be a string or a list of strings"):
        generate(ours, gpt2, [1], stop=[3])
    with pytest.raises(ValueError, match="prompt is 300 tokens; the context window is"):
        generate(ours, gpt2, [1] * 300)
    with pytest.raises(ValueError, match="prompt token ids must be integers in 0..127"):
        generate(ours, gpt2, [500])


def test_an_empty_stop_string_is_refused(gpt2):
    """It stopped nothing, silently: a caller who sent one meant something else."""
    model = ScriptedModel([1, 2], prompt_len=1)
    calls = [lambda stop: generate(model, gpt2, [1], stop=stop), lambda stop: next(stream(model, gpt2, [1], stop=stop)),
             lambda stop: Generation(model.config, gpt2, [1], GREEDY, stop=stop)]
    for stop in ("", ["\n", ""]):
        for call in calls:
            with pytest.raises(InvalidParameter, match="^stop strings must not be empty") as raised:
                call(stop)
            assert raised.value.param == "stop"
    assert generate(model, gpt2, [1], stop=["\n"], max_tokens=2).token_ids == [1, 2]  # a real one still passes


def test_logit_bias_is_checked_against_the_vocabulary_when_the_generation_is_made(gpt2, tiny):
    _, ours = tiny
    with pytest.raises(InvalidParameter, match="logit_bias token id 128 is outside the vocabulary \\(0..127\\)"):
        Generation(ours.config, gpt2, [1], SamplingParams(logit_bias={128: 1.0}))  # no sample() needed


def test_a_text_prompt_is_encoded_once(gpt2, monkeypatch):
    calls = []
    encode = gpt2.encode
    monkeypatch.setattr(gpt2, "encode", lambda *args, **kwargs: calls.append(args) or encode(*args, **kwargs))
    prompt_len = len(encode("Q:", add_special=True))
    completion = generate(ScriptedModel(encode(" yes"), prompt_len), gpt2, "Q:", GREEDY, max_tokens=1)
    assert completion.text == " yes" and completion.prompt_tokens == prompt_len
    assert calls == [("Q:",)]
