"""Qwen3, Phi-3 and Gemma 3 past what tests/test_models.py checks for every SPECS entry (logits as
HF transformers' for the full prompt and every cached step, a batch of different lengths as each
alone, attention weights): LongRoPE past the original context, the Model protocol's embed / head /
residual stream, the compiled step's calling convention, older config.json spellings, and the
one-line errors for what is not supported."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from nexttok.checkpoints.loading import load_model
from nexttok.models.attention import AttentionCapture
from nexttok.models.cache import KVCache
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.config import ConfigError
from nexttok.models.registry import from_hf_config, read_config
from nexttok.models.slot_cache import SlotCache
from tiny_models import VOCAB, write_tiny

ATOL = 1e-4
NEW = ["qwen3", "qwen3_sliding_bias_tied", "phi3", "phi3_longrope", "phi3_partial_rotary_tied", "gemma3",
       "gemma3_softcap_scalar"]
LONGROPE = ["phi3_longrope", "phi3_partial_rotary_tied"]
ORIGINAL = 32  # original_max_position_embeddings of the LongRoPE specs


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", LONGROPE)
@torch.inference_mode()
def test_longrope_past_the_original_context_matches_hf(pairs, name):
    """A call reaching past the original context rotates with the long factors, as HF decides per
    call: a whole prompt that long, and each cached step from there on (the cached keys keep the
    rotation they were stored with, in HF's cache as in ours)."""
    hf, ours, _ = pairs(name)
    ids = _ids(48, seed=11, batch=2)
    expected = hf(ids).logits
    torch.testing.assert_close(ours(ids), expected, atol=ATOL, rtol=0)
    short = hf(ids[:, :ORIGINAL]).logits  # within the original context: the short factors
    assert (short - expected[:, :ORIGINAL]).abs().max() > 100 * ATOL  # so the long ones were in use above
    out = hf(ids[:1, :28], use_cache=True)
    cache = KVCache.for_model(ours.config, max_len=48)
    torch.testing.assert_close(ours(ids[:1, :28], cache), out.logits, atol=ATOL, rtol=0)
    for t in range(28, 40):  # across the boundary at position 32
        out = hf(ids[:1, t : t + 1], cache=out.past_key_values, use_cache=True)
        torch.testing.assert_close(ours(ids[:1, t : t + 1], cache)[:, 0], out.logits[:, 0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", LONGROPE)
@torch.inference_mode()
def test_longrope_batch_across_the_boundary_equals_each_alone(pairs, name):
    """Rows choose their factors apart: one row past the original context does not move the others."""
    _, ours, _ = pairs(name)
    prompts = [_ids(n, seed=20 + n)[0] for n in (30, 12, 36)]
    width, steps = 36, 5  # the first row crosses position 32 while decoding
    ids = torch.zeros(3, width, dtype=torch.long)
    positions = torch.full((3, width), -1)
    for row, p in enumerate(prompts):  # left padding: position -1 marks the pads
        ids[row, width - len(p):] = p
        positions[row, width - len(p):] = torch.arange(len(p))
    cache = KVCache.for_model(ours.config, batch=3, max_len=width + steps)
    logits = ours(ids, cache, positions)
    nexts = _ids(steps, seed=98, batch=3)
    lengths = torch.tensor([[len(p)] for p in prompts])
    together = [ours(nexts[:, i : i + 1], cache, lengths + i)[:, 0] for i in range(steps)]
    for row, p in enumerate(prompts):
        alone_cache = KVCache.for_model(ours.config, max_len=width + steps)
        torch.testing.assert_close(logits[row, width - len(p):], ours(p[None], alone_cache)[0], atol=ATOL, rtol=0)
        for i in range(steps):
            step = ours(nexts[row : row + 1, i : i + 1], alone_cache)[0, 0]
            torch.testing.assert_close(together[i][row], step, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["phi3_longrope", "gemma3", "qwen3_sliding_bias_tied", "qwen3_moe", "gpt_oss",
                                  "glm4_moe", "gemma4", "gemma4_k_eq_v"])
@torch.inference_mode()
def test_server_slots_decode_together_as_alone(pairs, name):
    """The server's SlotCache: rows stored from slot 0 at lengths of their own (row-by-row
    attention over windows; LongRoPE rows crossing the original context at different steps)."""
    _, ours, _ = pairs(name)
    prompts = [_ids(n, seed=40 + n)[0].tolist() for n in (29, 6, 31)]

    def decode(group):
        cache = SlotCache.for_model(ours.config, slots=3, max_len=48)
        out = [[ours(torch.tensor([p]), cache.row(cache.claim()), last_only=True)[0, -1]] for p in group]
        for _ in range(5):
            view = cache.running_view(3)
            ids = torch.tensor([[int(out[min(r, len(group) - 1)][-1].argmax())] for r in range(view.n)])
            positions = torch.tensor([[cache.lengths[min(r, len(group) - 1)]] for r in range(view.n)])
            logits = ours(ids, view, positions, last_only=True)[:, -1]
            view.release_scratch()
            for r in range(len(group)):
                out[r].append(logits[r])
        return out

    together = decode(prompts)
    for p, seq in zip(prompts, together, strict=True):
        torch.testing.assert_close(torch.stack(decode([p])[0]), torch.stack(seq), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", NEW)
@torch.inference_mode()
def test_embed_head_and_residual_stream_are_hfs(pairs, name):
    """What the lesson's logit lens relies on: embed() is HF's input embedding (Gemma's scaled by
    √hidden), the residual stream after the embeddings and each layer is HF's, and head() of the
    last one gives the logits (Gemma's soft cap included)."""
    hf, ours, _ = pairs(name)
    ids = _ids(10, seed=5)
    ref = hf(ids, output_hidden_states=True)
    torch.testing.assert_close(ours.embed(ids), hf.get_input_embeddings()(ids), atol=1e-6, rtol=0)
    capture = AttentionCapture(full=True)
    logits = ours(ids, capture=capture)
    assert len(capture.hidden) == ours.config.num_hidden_layers + 1
    # HF's last hidden state is after the final norm; every earlier one is the raw residual stream
    for mine, theirs in zip(capture.hidden[:-1], ref.hidden_states[:-1], strict=True):
        torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.head(capture.hidden[-1]), logits, atol=0, rtol=0)
    torch.testing.assert_close(logits, ref.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["qwen3", "phi3_partial_rotary_tied", "gemma3"])
@torch.inference_mode()
def test_decode_steps_keep_the_compiled_calling_convention(pairs, name, monkeypatch):
    """Decode steps through CompiledDecode (layers called with TRACED masks and cache, attention
    through the opaque op) equal HF's logits. torch.compile itself is replaced by the identity: the
    calling convention is what an architecture must keep; compiling takes minutes on a small CPU."""
    hf, _, directory = pairs(name)
    ours = load_model(directory)
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    try:
        compile_decode(ours)
    except CompileUnavailable as e:
        pytest.skip(str(e))
    ids = _ids(16, seed=2)
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=16)
    ours(ids[:, :6], cache)
    for t in range(6, 16):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=ATOL, rtol=0)
    assert ours.compiled.compiled_rows == {1}


@torch.inference_mode()
def test_int8_keeps_rope_frequencies_in_float32(tmp_path):
    """Quantizing casts the model to bfloat16 after the frequencies exist: they must stay float32
    (an angle position * frequency in bfloat16 is off by radians at long positions)."""
    hf = write_tiny("phi3_longrope", tmp_path)
    ours = load_model(tmp_path, dtype="int8")
    assert ours.inv_freq_short.dtype == ours.inv_freq_long.dtype == torch.float32
    ids = _ids(40, seed=7)
    got, expected = ours(ids).float(), hf(ids).logits
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()


@torch.inference_mode()
def test_gemma3_transformers4_config_spelling(pairs, tmp_path):
    """transformers 4's keys (rope_theta + rope_scaling for global layers, rope_local_base_freq,
    sliding_window_pattern instead of layer_types) mean what transformers 5's do, to HF and to us."""
    hf, ours, directory = pairs("gemma3")
    config = json.loads((directory / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        config.pop(key, None)
    config.update(rope_theta=10000.0, rope_local_base_freq=100.0, sliding_window_pattern=2,
                  rope_scaling={"rope_type": "linear", "factor": 8.0})
    for f in directory.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = transformers.AutoConfig.from_pretrained(tmp_path)
    assert again.layer_types == hf.config.layer_types and again.rope_parameters == hf.config.rope_parameters
    assert read_config(tmp_path) == ours.config
    ids = _ids(12, seed=3)
    torch.testing.assert_close(load_model(tmp_path)(ids), hf(ids).logits, atol=ATOL, rtol=0)


def test_phi3_older_spellings_and_qwen3_defaults():
    base = {"model_type": "phi3", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 64}
    factors = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    su = from_hf_config({**base, "original_max_position_embeddings": 32, "rope_theta": 500.0,
                         "rope_scaling": {"type": "su", **factors}})
    v5 = from_hf_config({**base, "rope_parameters": {"rope_type": "longrope", "rope_theta": 500.0,
                                                     "original_max_position_embeddings": 32, **factors}})
    assert su == v5 and su.rope_scaling["original_max_position_embeddings"] == 32
    assert from_hf_config({**base, "sliding_window": 8}).layer_types == ["sliding_attention"] * 2
    qwen3 = from_hf_config({**base, "model_type": "qwen3", "num_key_value_heads": 2, "attention_bias": True,
                            "sliding_window": 8, "use_sliding_window": False})
    assert qwen3.head_dim == 128  # Qwen3Config's default, not hidden_size // heads
    assert qwen3.attention_bias and qwen3.o_proj_bias and qwen3.sliding_window is None


GEMMA3 = {"model_type": "gemma3_text", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 96, "head_dim": 16}
PHI3 = {**GEMMA3, "model_type": "phi3", "max_position_embeddings": 64, "original_max_position_embeddings": 32,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}}


@pytest.mark.parametrize("config,message", [
    ({**GEMMA3, "model_type": "gemma3"}, "'gemma3' is the multimodal Gemma 3 .*\\(model_type gemma3_text"),
    ({**GEMMA3, "use_bidirectional_attention": True}, "use_bidirectional_attention \\(EmbeddingGemma\\) is not"),
    ({**GEMMA3, "hidden_activation": "relu"}, "activation 'relu' is not supported"),
    ({**GEMMA3, "final_logit_softcapping": 0}, "final_logit_softcapping must be a positive number"),
    ({**GEMMA3, "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                                    "full_attention": {"rope_type": "default"}}},
     "RoPE scaling of sliding_attention layers is not supported"),
    ({**GEMMA3, "sliding_window_pattern": 0}, "sliding_window_pattern must be a positive integer"),
    ({**PHI3, "rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_type 'linear' is not supported \\(supported: default, longrope\\)"),
    ({**PHI3, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 8}},
     "rope short_factor has 3 entries; the rotated dimensions need 8"),
    ({**PHI3, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}}, "needs long_factor"),
    ({**PHI3, "partial_rotary_factor": 0.5625}, "partial_rotary_factor 0.5625 must be in \\(0, 1\\] and rotate an even"),
    ({**GEMMA3, "model_type": "llama", "partial_rotary_factor": 0.5},
     "partial_rotary_factor != 1 is not supported for llama"),
    ({**GEMMA3, "model_type": "qwen3", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_type 'yarn' needs original_max_position_embeddings, a positive integer, got None"),
    ({**GEMMA3, "model_type": "qwen3", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
     "rope_type 'dynamic' is not supported \\(supported: default, linear, llama3, yarn\\)"),
])
def test_unsupported_configs_say_what_in_one_line(config, message):
    with pytest.raises(ConfigError, match=message) as error:
        from_hf_config(config)
    assert "\n" not in str(error.value)
