"""Qwen3-Next and Qwen3.5 (gated DeltaNet between gated attention layers) past what tests/test_models.py
checks for every SPECS entry: the delta rule against HF's own, a prefill in chunks at odd boundaries,
a padded batch as HF pads it (attention_mask), the state's fixed size, the server's slots, Qwen3.5's
multimodal checkpoints, `nexttok run`, and GGUF in llama.cpp's layouts."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from nexttok.models.cache import KVCache, StateRollback
from nexttok.models.gated_deltanet import delta_chunked, delta_step, l2norm
from tiny_models import VOCAB, write_tiny, write_tiny_tokenizer

ATOL = 1e-4
HYBRIDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def _rule_inputs(b=2, h=4, t=150, dk=8, dv=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (l2norm(torch.randn(b, h, t, dk, generator=gen)) for _ in range(2))
    v = torch.randn(b, h, t, dv, generator=gen)
    g = -F.softplus(torch.randn(b, h, t, generator=gen))  # log decays, <= 0
    beta = torch.rand(b, h, t, generator=gen)
    return q, k, v, g, beta, torch.randn(b, h, dk, dv, generator=gen)


@torch.inference_mode()
def test_the_delta_rule_in_chunks_and_by_steps_equals_hfs():
    """Our chunked rule (several chunk sizes, a tail chunk padded) and our one-token step give HF's
    torch_chunk_gated_delta_rule's and torch_recurrent_gated_delta_rule's outputs and final state,
    from a state already holding something."""
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_chunk_gated_delta_rule,
        torch_recurrent_gated_delta_rule,
    )

    q, k, v, g, beta, start = _rule_inputs()
    hf_args = [x.transpose(1, 2) for x in (q, k, v, g, beta)]  # HF's (B, T, H, ...)
    hf_out, hf_state = torch_chunk_gated_delta_rule(*hf_args, initial_state=start, output_final_state=True)
    rec_out, rec_state = torch_recurrent_gated_delta_rule(*hf_args, initial_state=start, output_final_state=True)
    torch.testing.assert_close(hf_out, rec_out, atol=1e-4, rtol=0)  # HF's two agree this closely
    scaled = q * q.shape[-1] ** -0.5  # HF scales inside; ours takes q scaled
    for chunk in (64, 7, 150):
        state = start.clone()
        out = delta_chunked(scaled, k, v, g, beta, state, chunk=chunk)
        torch.testing.assert_close(out.transpose(1, 2), hf_out, atol=1e-4, rtol=0)
        torch.testing.assert_close(state, hf_state, atol=1e-4, rtol=0)
    state = start.clone()
    steps = [delta_step(scaled[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], g[:, :, i : i + 1],
                        beta[:, :, i : i + 1], state) for i in range(q.shape[2])]
    torch.testing.assert_close(torch.cat(steps, dim=2).transpose(1, 2), rec_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(state, rec_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", HYBRIDS)
@torch.inference_mode()
def test_a_prefill_in_chunks_at_odd_boundaries_gives_hfs_logits(pairs, name):
    """Calls of 37, 73 (across a 64-token chunk's edge) and 1 tokens, then one token at a time: HF's
    logits with its cache over the same calls, and its one-call logits (which its own cached path
    meets within ~7e-5 here: float32 sums in other orders)."""
    hf, ours, _ = pairs(name)
    ids = _ids(116, seed=8, batch=2)
    whole = hf(ids).logits
    cache = KVCache.for_model(ours.config, batch=2, max_len=120)
    bounds = [0, 37, 110, 111, *range(112, 117)]
    past, got, expected = None, [], []
    for a, b in zip(bounds, bounds[1:], strict=False):
        out = hf(ids[:, a:b], cache=past, use_cache=True)
        past = out.past_key_values
        expected.append(out.logits)
        got.append(ours(ids[:, a:b], cache))
    got, expected = torch.cat(got, dim=1), torch.cat(expected, dim=1)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(got, whole, atol=2 * ATOL, rtol=0)


@torch.inference_mode()
def test_the_state_stays_one_size_while_the_keys_grow(pairs):
    """Keys and values are kept for the attention layer only; each DeltaNet layer keeps its
    convolution's last kernel - 1 inputs and a (value heads, d_k, d_v) state, whatever the context."""
    _, ours, _ = pairs("qwen3_next")
    config = ours.config
    assert config.recurrent_layers == [0, 2, 3] and config.attention_layers == [1]
    cache = KVCache.for_model(config, max_len=200)
    assert cache.k.shape[0] == 1  # one attention layer's rows, not four
    conv_dim = 2 * config.linear_num_key_heads * config.linear_key_head_dim + config.linear_num_value_heads * 8
    per_layer = 4 * (conv_dim * (config.conv_kernel - 1) + config.linear_num_value_heads * 16 * 8)  # float32
    sizes = []
    for n in (1, 9, 150):
        ours(_ids(n, seed=n), cache)
        sizes.append(cache.state_bytes())
    assert sizes == [3 * per_layer] * 3 and cache.offset == 160
    with pytest.raises(StateRollback, match=r"recurrent layers \[0, 2, 3\] keep a state"):
        cache.truncate(5)


@torch.inference_mode()
def test_qwen3_5s_multimodal_checkpoint_runs_its_text_model(tmp_path):
    """Qwen3.5 ships as Qwen3_5ForConditionalGeneration (model_type qwen3_5, the text model under
    text_config and model.language_model.*): we read its text model, leave the vision tower, and give
    the multimodal model's logits on text."""
    import transformers

    from nexttok.checkpoints.loading import load_model
    from tiny_models import SPECS

    text = {k: v for k, v in SPECS["qwen3_5"][1].items() if k != "tie_word_embeddings"}
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, num_position_embeddings=16)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    for p in hf.parameters():
        p.normal_(0, 0.2)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_5"
    ours = load_model(tmp_path)
    assert ours.config.model_type == "qwen3_5_text" and not ours.config.tie_word_embeddings
    ids = _ids(20, seed=2)
    torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name, arch", [("qwen3_next_gguf", "qwen3next"), ("qwen3_5_gguf", "qwen35")])
@torch.inference_mode()
def test_gguf_in_llama_cpps_layouts_gives_hfs_logits(tmp_path, name, arch):
    """Our exporter writes llama.cpp's qwen3next / qwen35 (the DeltaNet under ssm.*, which layers are
    recurrent as attention.recurrent_layers, q/k/v and z apart, norms as 1 + w, A_log as -exp(A_log),
    qwen35's value heads tiled); the loader reads the layout back (keeping the tiled order): HF's logits
    at every cached step, and Q8_0 within its 8 bits."""
    from gguf import GGUFReader

    from nexttok.checkpoints.export import write_gguf
    from nexttok.checkpoints.loading import load_model

    hf = write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    path = write_gguf(tmp_path, tmp_path / f"{name}-F32.gguf", "F32")
    reader = GGUFReader(str(path))
    fields = reader.fields
    assert fields["general.architecture"].contents() == arch
    assert fields[f"{arch}.attention.recurrent_layers"].contents() == [t == "linear_attention" for t in
                                                                         hf.config.layer_types]
    assert [fields[f"{arch}.ssm.{key}"].contents() for key in ("conv_kernel", "state_size", "group_count",
                                                               "time_step_rank", "inner_size")] == [4, 16, 2, 4, 64]
    names = {t.name for t in reader.tensors}
    ba = {"blk.0.ssm_ba.weight"} if arch == "qwen3next" else {"blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight"}
    assert {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias",
            "blk.0.ssm_conv1d.weight", "blk.0.ssm_norm.weight", "blk.0.post_attention_norm.weight", *ba} <= names
    ours = load_model(path)
    assert ours.config.layer_types == hf.config.layer_types
    assert ours.config.linear_value_heads_tiled == (arch == "qwen35")
    ids = _ids(20, seed=2)
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=24)
    torch.testing.assert_close(ours(ids[:, :8], cache), expected[:, :8], atol=ATOL, rtol=0)
    for t in range(8, 20):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=ATOL, rtol=0)
    # 8-bit weights move these random tiny hybrids' logits more than a transformer's: 1.5-2.4% of the
    # largest logit here whether the kernels run the blocks or the weights are dequantized (Qwen3-MoE: 0.4%)
    quantized = load_model(write_gguf(tmp_path, tmp_path / f"{name}-Q8_0.gguf", "Q8_0"))
    assert (quantized(ids) - expected).abs().mean() <= 0.03 * expected.abs().max()


def test_gguf_export_refuses_what_llama_cpp_cannot_hold(pairs, tmp_path):
    """llama.cpp takes d_v from ssm.state_size (d_k): a DeltaNet whose d_v differs is refused in one line."""
    from nexttok.checkpoints.export import write_gguf
    from nexttok.checkpoints.gguf.metadata import GGUFError

    _, _, directory = pairs("qwen3_5")
    with pytest.raises(GGUFError, match="cannot hold a DeltaNet whose d_v differs from its d_k"):
        write_gguf(directory, tmp_path / "x.gguf", "F32")


def test_qwen3_5s_tokenizer_keeps_combining_marks_with_their_letters_as_hfs(tmp_path):
    """Qwen3.5's pre-tokenizer differs from Qwen2's in \\p{M}: a letter's combining marks (Devanagari's
    vowel signs) stay in its word. HF's Qwen3_5Tokenizer writes it; ours reads that tokenizer.json and
    encodes as HF's does; a GGUF's tokenizer.ggml.pre "qwen35" (llama.cpp's name) maps to the same."""
    from transformers.models.qwen3_5 import tokenization_qwen3_5

    from nexttok.checkpoints.gguf.tokenizer import PRE_TOKENIZERS
    from nexttok.tokenizers.from_json import from_directory
    from nexttok.tokenizers.tokenizer import bytes_to_unicode

    by_byte = bytes_to_unicode()
    vocab = {by_byte[b]: b for b in range(256)}
    merges = []
    for word in ("स्", "ते", "th"):  # a letter and its mark (virama, vowel sign) merge into one token
        chars = "".join(by_byte[b] for b in word.encode())
        merges += [m for m in ((chars[:i], chars[i]) for i in range(1, len(chars))) if m not in merges]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    hf = tokenization_qwen3_5.Qwen3_5Tokenizer(vocab=vocab, merges=merges)
    hf.save_pretrained(tmp_path)
    ours = from_directory(tmp_path)
    for text in ("नमस्ते दुनिया", "the q\u0301x, 12 thé", "don't\r\n  stop"):
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
    pre, normalizer = PRE_TOKENIZERS["qwen35"]
    assert pre["pretokenizers"][0]["pattern"]["Regex"] == tokenization_qwen3_5.PRETOKENIZE_REGEX
    assert normalizer == {"type": "NFC"}
