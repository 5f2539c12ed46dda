"""Mixtures of experts past what tests/test_models.py checks for every SPECS entry (HF's logits at
every cached step, padded batches, attention): the block kernel that multiplies each row by its
routed expert only, block experts against float experts, the router's choice as a capture records
it against HF's router logits, attention sinks on the decode kernel, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nexttok.models import kernels
from nexttok.models.attention import ALL, AttentionCapture, attend
from nexttok.models.block_quant import BlockExperts
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.config import ConfigError
from nexttok.models.moe import Experts, Routing
from nexttok.models.registry import from_hf_config
from nexttok.parallel.layers import check_world
from test_kernels import ISAS, quantized, random_blocks, reference
from tiny_models import MOE, VOCAB, write_tiny

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")


def _experts(kind: str, e: int, rows: int, k: int, seed: int) -> tuple[kernels.Tiled, torch.Tensor]:
    """E experts of `rows` rows each, stacked as a GGUF 3-D tensor's rows: tiled, and their values."""
    raw = random_blocks(kind, e * rows, k, seed=seed)
    return kernels.repack(kind, torch.from_numpy(raw), k, matrices=e), reference(kind, raw).view(e, rows, k)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_moe_mlp_reads_only_the_routed_experts(isa):
    """Routings with unused experts, one expert taken by every token, and a token per expert: an
    expert no token takes may hold anything (its tiles are not read: here, NaN scales), and each
    token's output is its own experts' sum whatever the others' routing."""
    e, hidden, inner = 6, 256, 32
    gate, wg = _experts("Q8_0", e, inner, hidden, 1)
    up, wu = _experts("Q4_0", e, inner, hidden, 2)
    down, wd = _experts("Q8_0", e, hidden, inner, 3)
    for part in (gate, up, down):
        part.tiles.view(e, -1)[5] = 0xFF  # expert 5's f16 scales: all ones bits, NaN
    block = BlockExperts([gate, up], [down], e, isa, ("silu", 1.702, 7.0))
    x = torch.randn(5, hidden, generator=torch.Generator().manual_seed(3))
    weights = torch.rand(5, 2)
    for ids in ([[2, 0], [2, 4], [1, 3], [0, 1], [4, 2]], [[3, 3]] * 5, [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4]]):
        ids = torch.tensor(ids)
        got = block(x, Routing(ids, weights, torch.rand(5, e)))
        assert torch.isfinite(got).all()
        for t in range(5):  # each token alone: the same bits
            alone = block(x[t : t + 1], Routing(ids[t : t + 1], weights[t : t + 1], torch.rand(1, e)))
            assert torch.equal(alone[0], got[t])
            expected = sum(weights[t, j].double() * (quantized(_swiglu((quantized(x[t : t + 1]) @ torch.cat(
                (wg[g], wu[g])).double().T).float())) @ wd[g].double().T)[0] for j, g in enumerate(ids[t]))
            assert (got[t].double() - expected).abs().max() <= 1e-4 * expected.abs().max()


@needs_kernels
def test_moe_mlp_errors_are_one_line():
    gate, _ = _experts("Q8_0", 2, 32, 64, 0)
    down, _ = _experts("Q8_0", 2, 64, 32, 0)
    x = torch.randn(1, 64)
    for ids, message in (([[2]], r"expert 2 out of range 0..1"), ([[-1]], r"expert -1 out of range")):
        with pytest.raises(RuntimeError, match=message) as error:
            kernels.moe_mlp(x, torch.tensor(ids), torch.ones(1, 1), [gate, gate], [down], 2, 0)
        assert "\n" not in str(error.value).split("\n\n")[0]
    with pytest.raises(ValueError, match="12 rows are not 2 matrices of whole tiles of 8"):
        _experts("Q8_0", 2, 6, 64, 0)
    raw = torch.from_numpy(random_blocks("Q8_0", 12, 64, seed=0))
    odd = kernels.Tiled("Q8_0", kernels.repack("Q8_0", raw, 64).tiles, 12, 64, matrices=2)
    with pytest.raises(RuntimeError, match="must be whole tiles of 8"):
        kernels.moe_mlp(x, torch.tensor([[0]]), torch.ones(1, 1), [odd, odd], [down], 2, 0)
    whole = kernels.repack("Q8_0", torch.from_numpy(random_blocks("Q8_0", 64, 64, seed=0)), 64)  # one matrix
    with pytest.raises(ValueError, match=r"repacked as 2 matrices \(kernels.repack\(..., matrices=2\)\), not \[1, 1\]"):
        kernels.moe_mlp(x, torch.tensor([[0]]), torch.ones(1, 1), [whole, whole], [down], 2, 0)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_block_experts_equal_float_experts_over_the_same_values(isa, activation):
    """BlockExperts (the file's blocks, one kernels.moe_mlp call) against the same values in float:
    the same sums up to the 8-bit activations, which the reference applies too, per product; gpt-oss's
    clamped activation with its biases as well."""
    e, hidden, inner, n, top = 4, 256, 256, 7, 2
    gate, wg = _experts("Q8_0", e, inner, hidden, 5)
    up, wu = _experts("Q4_K", e, inner, hidden, 6)
    down, wd = _experts("Q6_K", e, hidden, inner, 7)
    oai = activation == "swiglu_oai"
    biases = (torch.randn(e, 2 * inner), torch.randn(e, hidden)) if oai else (None, None)
    block = BlockExperts([gate, up], [down], e, isa, (activation, 1.5, 0.5), *biases)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(8)) * 20
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(i))[:top] for i in range(n)])
    routing = Routing(ids, torch.rand(n, top), torch.rand(n, e))
    got = block(x, routing)
    expected = torch.zeros(n, hidden, dtype=torch.float64)
    for t in range(n):
        for j in range(top):
            g = ids[t, j]
            h = quantized(x[t : t + 1]) @ torch.cat((wg[g], wu[g])).double().T  # (1, 2 inner)
            h = h.float() + (biases[0][g] if oai else 0)
            act = _clamped(h, 1.5, 0.5) if oai else _swiglu(h)
            y = (quantized(act) @ wd[g].double().T)[0] + (biases[1][g].double() if oai else 0)
            expected[t] += routing.weights[t, j].double() * y
    assert (got.double() - expected).abs().max() <= 1e-4 * expected.abs().max()
    if oai:  # the clamp bites: the activation differs from SwiGLU's here
        assert (_clamped(h, 1.5, 0.5) - _swiglu(h)).abs().max() > 0.1
    gu, dn = block.expert_values(2)
    assert torch.equal(gu, torch.cat((wg[2], wu[2]))) and torch.equal(dn, wd[2])


def _clamped(h: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


@needs_kernels
def test_decode_kernel_takes_attention_sinks():
    """The decode kernel's softmax with a sink per head equals the written-out one (what prefill and
    HF transformers compute), over cache views of several lengths and grouped heads."""
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0])
    q = torch.randn(2, 4, 1, 16)
    for length in (1, 7, 40):
        k, v = torch.randn(2, 2, length, 16), torch.randn(2, 2, length, 16)
        got = kernels.attend(q, k, v, sinks)
        kh, vh = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = q @ kh.transpose(-1, -2) / 4.0
        logits = torch.cat((scores, sinks.view(1, 4, 1, 1).expand(2, 4, 1, 1)), dim=-1)
        expected = torch.softmax(logits, dim=-1)[..., :-1] @ vh
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(attend(q, k, v, ALL, sinks=sinks), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(kernels.attend(q, k, v), F.scaled_dot_product_attention(q, kh, vh), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", MOE)
@torch.inference_mode()
def test_capture_records_the_routers_choice_as_hf(pairs, name):
    """capture.experts[layer]: every position's k experts, their weights and every expert's score,
    from the same router logits as HF's (output_router_logits), chosen by the family's rule."""
    hf, ours, _ = pairs(name)
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    capture = AttentionCapture()
    ours(ids, capture=capture)
    sparse = [i for i, kind in enumerate(ours.config.mlp_types) if kind == "sparse"]
    assert sorted(capture.experts) == sparse
    ref = hf(ids, output_router_logits=True).router_logits
    ref = [r for r in ref if r is not None] if isinstance(ref, (list, tuple)) else [ref]
    k = ours.config.num_experts_per_tok
    for layer, logits in zip(sparse, ref, strict=True):
        chosen, weights, probs = capture.experts[layer]
        assert chosen.shape == weights.shape == (1, 12, k) and probs.shape == (1, 12, ours.config.num_experts)
        logits = logits.view(1, 12, -1).float()
        scores = logits.sigmoid() if ours.config.router == "sigmoid" else torch.softmax(logits, dim=-1)
        torch.testing.assert_close(probs, scores, atol=1e-5, rtol=0)
        if ours.config.router != "sigmoid":  # the sigmoid router chooses by biased scores within groups
            assert torch.equal(chosen.sort(-1).values, logits.topk(k, dim=-1).indices.sort(-1).values)
        if ours.config.norm_topk_prob or ours.config.router == "topk_softmax":
            total = ours.config.routed_scaling_factor
            torch.testing.assert_close(weights.sum(-1), torch.full((1, 12), total), atol=1e-5, rtol=0)


def test_moe_refuses_compile_and_tensor_parallelism_in_one_line(pairs):
    _, ours, _ = pairs("qwen3_moe")
    with pytest.raises(CompileUnavailable, match=r"mixture-of-experts layers \(qwen3_moe\) choose their weights"):
        compile_decode(ours)
    with pytest.raises(ValueError, match=r"--tensor-parallel 2: mixture-of-experts layers \(qwen3_moe\) are not split"):
        check_world(ours.config, 2)
    check_world(ours.config, 1)


MOE_BASE = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32}


@pytest.mark.parametrize("changes,message", [
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must be an integer in 1..num_experts \(8\)"),
    ({"num_experts_per_tok": 0}, r"num_experts_per_tok \(0\) must be"),
    ({"num_experts": None}, "num_experts must be a positive integer, got None"),
    ({"moe_intermediate_size": -1}, "moe_intermediate_size must be a positive integer, got -1"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer, got 0"),
    ({"mlp_only_layers": "1"}, "mlp_only_layers must be a list of layer indices"),
    ({"model_type": "glm4_moe", "n_routed_experts": 8, "n_group": 3}, r"n_group \(3\) must divide the 8 experts"),
    ({"model_type": "glm4_moe", "n_routed_experts": 8, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 3},
     r"num_experts_per_tok \(3\) exceeds the experts of the topk_group \(1\) groups eligible \(2\)"),
    ({"model_type": "olmoe", "clip_qkv": 8.0}, r"OLMoE's clip_qkv \(8.0\) is not supported"),
    ({"model_type": "granitemoe", "num_local_experts": 8, "logits_scaling": 0}, "logits_scaling must be a positive"),
    ({"model_type": "gpt_oss", "num_local_experts": 8, "swiglu_limit": float("inf")}, "swiglu_limit must be a positive"),
    ({"model_type": "deepseek_v3"}, r"model_type 'deepseek_v3' is not supported \(supported: gpt2, llama, .*qwen3_moe"),
])
def test_bad_moe_configs_say_what_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        from_hf_config({**MOE_BASE, **changes})
    assert "\n" not in str(error.value)


def test_experts_are_stacked_from_per_expert_tensors_in_order():
    """The loader's contract with moe.Experts: parts listed expert by expert, gate before up."""
    config = from_hf_config(MOE_BASE)
    with torch.device("meta"):
        experts = Experts(config)
    parts = experts.checkpoint_parts("gate_up_proj")
    assert parts[:3] == [("0.gate_proj.weight", (32, 64)), ("0.up_proj.weight", (32, 64)), ("1.gate_proj.weight", (32, 64))]
    assert len(parts) == 16 and experts.checkpoint_parts("down_proj")[7] == ("7.down_proj.weight", (64, 32))


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "glm4_moe", "granitemoe"])
def test_nexttok_run_on_each_family_as_a_new_user_would(tmp_path, capsys, name):
    """What the issue found refused: `nexttok run DIR` on a tiny random checkpoint of each family
    now generates (--json: one Step a token, the same tokens as the library's greedy loop)."""
    import json

    from nexttok.cli import main
    from nexttok.generation.loop import generate
    from nexttok.generation.sampling import SamplingParams
    from tiny_models import write_tiny_tokenizer

    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    assert main(["run", str(tmp_path), "Hello there", "--temperature", "0", "--max-tokens", "6", "--json"]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    checkpoint = load_checkpoint_for(tmp_path)
    expected = generate(checkpoint.model, checkpoint.tokenizer, "Hello there", SamplingParams(temperature=0),
                        max_tokens=6)
    assert [s["token_id"] for s in steps] == expected.token_ids


def load_checkpoint_for(directory):
    from nexttok.checkpoints.loading import load_checkpoint

    return load_checkpoint(directory)


@torch.inference_mode()
def test_glm4_moe_checkpoint_with_next_token_prediction_layers_loads_as_hf_does(tmp_path):
    """GLM-4.5's checkpoints carry num_nextn_predict_layers extra layers past num_hidden_layers (for
    the model's own speculative decoding): left unread, as HF transformers leaves them; any other
    stray tensor is still refused by name."""
    from safetensors.torch import load_file, save_file

    from nexttok.checkpoints.loading import load_model
    from nexttok.models.config import CheckpointError

    hf = write_tiny("glm4_moe", tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    extra = {"model.layers.3.eh_proj.weight": torch.randn(64, 128), "model.layers.3.enorm.weight": torch.ones(64),
             "model.layers.3.mlp.experts.0.up_proj.weight": torch.randn(32, 64)}
    save_file({**tensors, **extra}, str(path), metadata={"format": "pt"})
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(load_model(tmp_path)(ids), hf(ids).logits, atol=1e-4, rtol=0)
    save_file({**tensors, **extra, "model.mystery.weight": torch.ones(3)}, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"1 tensors this architecture does not use: model.mystery.weight$"):
        load_model(tmp_path)
