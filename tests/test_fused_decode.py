"""The fused decode layer (models/fused_decode.py, kernels/csrc/decode.cpp) computes exactly what the
eager layer computes: the same logits, bit for bit, at every cached step, at batch 1 and 2, on the
default model's real file, over the server's batch of slots, and on tiny GGUFs of every family it
takes (Llama, Qwen2's biases, Qwen3's q/k norms, SmolLM3 with its NoPE layers run eagerly between);
HF parity of these models is the GGUF tests' (they decode through this path now). What it cannot
take runs eagerly, and a bad call is one line naming what was wrong."""

from __future__ import annotations

import pytest
import torch

from nexttok.checkpoints.bundled import DEFAULT_MODEL, bundled_model_file
from nexttok.checkpoints.loading import load_model
from nexttok.models import kernels
from nexttok.models.cache import KVCache
from nexttok.models.fused_decode import FusedDecode, _linear, fuse_decode

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the block kernels are not built here")


def decode_logits(model, prompt: torch.Tensor, steps: int, fused: bool, windowed: bool = False) -> list[torch.Tensor]:
    """Logits of the prompt's last position and of `steps` greedy decode steps after it."""
    plan = model.fused
    model.fused = plan if fused else None
    try:
        cache = KVCache.for_model(model.config, batch=prompt.shape[0], max_len=prompt.shape[1] + steps + 1,
                                  windowed=windowed)
        with torch.inference_mode():
            out = [model(prompt, cache, last_only=True)[:, -1]]
            for _ in range(steps):
                out.append(model(out[-1].argmax(-1, keepdim=True), cache, last_only=True)[:, -1])
        return out
    finally:
        model.fused = plan


def assert_same_logits(model, prompt, steps=8, windowed=False):
    fused = decode_logits(model, prompt, steps, fused=True, windowed=windowed)
    eager = decode_logits(model, prompt, steps, fused=False, windowed=windowed)
    for step, (a, b) in enumerate(zip(fused, eager, strict=True)):
        assert torch.equal(a, b), f"step {step}: fused and eager logits differ by {(a - b).abs().max():.3g}"


@pytest.fixture(scope="module")
def default_model():
    return load_model(bundled_model_file(DEFAULT_MODEL))


def test_the_default_model_decodes_every_layer_fused_with_the_eager_logits(default_model):
    assert isinstance(default_model.fused, FusedDecode)
    assert all(op is not None for op in default_model.fused.layers)
    prompt = torch.randint(0, default_model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    assert_same_logits(default_model, prompt, steps=16)
    cache = KVCache.for_model(default_model.config, max_len=8)
    first = torch.zeros(1, dtype=torch.long)
    runs = default_model.fused._runs(cache, cache, {None: first})
    assert [run[:2] for run in runs] == [[0, 30]] and runs[0][2] is first  # the whole step: one C++ call


def test_a_batch_of_two_rows_gives_each_rows_eager_logits(default_model):
    prompt = torch.randint(0, default_model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    assert_same_logits(default_model, prompt, steps=6)


@pytest.mark.parametrize(("name", "fused_layers"),
                         [("llama_head_dim", 2), ("qwen2", 2), ("qwen3", 2), ("smollm3_every4", 3)])
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_each_family_it_takes_gives_the_eager_logits(written_gguf, name, fused_layers, kind):
    _, path = written_gguf(name, kind)
    model = load_model(path)
    assert model.fused is not None and sum(op is not None for op in model.fused.layers) == fused_layers
    lean = name != "smollm3_every4"  # every layer planned: the step whole, its ends (table and head) with it
    assert model.fused.lean == lean and (model.fused.table is not None) == (model.fused.head is not None) == lean
    prompt = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    assert_same_logits(model, prompt, steps=8)
    assert_same_logits(model, prompt[:1], steps=8, windowed=True)


@pytest.mark.parametrize("name", ["olmo2", "granite", "exaone4"])
def test_layers_that_differ_from_llamas_are_left_to_run_eagerly(written_gguf, name):
    """OLMo 2's and EXAONE 4's norms after the blocks, Granite's multipliers: no plan for them (and
    SmolLM3's layers without RoPE, above, run eagerly between fused ones)."""
    _, path = written_gguf(name, "Q8_0")
    model = load_model(path)
    assert model.fused is None or all(op is None for op in model.fused.layers)


def test_a_float_model_has_no_fused_plan(written_gguf):
    _, path = written_gguf("qwen2", "F32")
    assert load_model(path).fused is None
    assert fuse_decode(load_model(path.parent)).fused is None  # a checkpoint directory: torch's linears


def cached_steps(model, prompt: torch.Tensor, steps: int) -> tuple[list[torch.Tensor], KVCache]:
    cache = KVCache.for_model(model.config, batch=prompt.shape[0], max_len=prompt.shape[1] + steps + 1)
    with torch.inference_mode():
        out = [model(prompt, cache, last_only=True)[:, -1]]
        for _ in range(steps):
            out.append(model(out[-1].argmax(-1, keepdim=True), cache, last_only=True)[:, -1])
    return out, cache


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("ends", ["table and head", "head", "neither"])
def test_a_plain_step_in_one_call_is_the_general_fused_steps_bit_for_bit(default_model, monkeypatch, rows, ends):
    """FusedDecode.step, the lean path (no positions, masks or RoPE lookups made around the one
    call; with its head, the final norm and lm_head in that call too, and with its table the
    token rows, RoPE rows and key slots made there), gives the general fused path's logits bit for
    bit and leaves the cache as it leaves it: the same keys, positions, offset and contiguity."""
    assert default_model.fused.lean and None not in (default_model.fused.head, default_model.fused.table)
    if ends != "table and head":
        monkeypatch.setattr(default_model.fused, "table", None)
    head = ends != "neither"
    if not head:
        monkeypatch.setattr(default_model.fused, "head", None)
    prompt = torch.randint(0, default_model.config.vocab_size, (rows, 9), generator=torch.Generator().manual_seed(2))
    taken = []
    step = FusedDecode.step

    def record(*args, **kwargs):
        taken.append((kwargs.get("logits", False), step(*args, **kwargs)))
        return taken[-1][1]

    monkeypatch.setattr(FusedDecode, "step", record)
    lean, lean_cache = cached_steps(default_model, prompt, 6)
    # the prefill declined (its logits, then its stream); each step in one call: its logits, or
    # without a head its stream (the logits declined first)
    each = [(True, True)] if head else [(True, False), (False, True)]
    assert [(logits, x is not None) for logits, x in taken] == [(True, False), (False, False)] + each * 6
    monkeypatch.setattr(FusedDecode, "step", lambda *a, **k: None)
    general, general_cache = cached_steps(default_model, prompt, 6)
    assert all(torch.equal(a, b) for a, b in zip(lean, general, strict=True))
    assert (lean_cache.offset, lean_cache.contiguous) == (general_cache.offset, general_cache.contiguous)
    assert torch.equal(lean_cache.pos, general_cache.pos)
    assert all(torch.equal(a, b) for ga, gb in zip(lean_cache.groups, general_cache.groups, strict=True)
               for a, b in zip(ga, gb, strict=True))


def test_the_lean_step_declines_what_the_general_path_must_do(default_model):
    """A prefill, padding (a cache no longer contiguous), a position past the model's context and
    autograd all go the general way (which raises where it must), the cache untouched."""
    fused, ids = default_model.fused, torch.tensor([[1]])
    with torch.inference_mode():
        cache = KVCache.for_model(default_model.config, max_len=8)
        assert fused.step(default_model, torch.tensor([[1, 2]]), cache) is None  # prefill
        cache.contiguous = False
        assert fused.step(default_model, ids, cache) is None
        full = KVCache.for_model(default_model.config, max_len=8)
        full.offset = default_model.config.max_position_embeddings
        assert fused.step(default_model, ids, full) is None
        assert full.offset == default_model.config.max_position_embeddings  # untouched
    assert fused.step(default_model, ids, KVCache.for_model(default_model.config, max_len=8)) is None  # autograd


def test_steps_it_does_not_take_run_eagerly(default_model):
    ids = torch.tensor([[1]])
    cache = KVCache.for_model(default_model.config, max_len=8)
    with torch.inference_mode():
        assert FusedDecode.takes(ids, cache, None)
        assert not FusedDecode.takes(torch.tensor([[1, 2]]), cache, None)  # prefill
        assert not FusedDecode.takes(ids, None, None)  # no cache
        assert not FusedDecode.takes(ids, cache, object())  # a viewer capturing attention
    assert not FusedDecode.takes(ids, cache, None)  # autograd on


def test_a_bad_call_is_one_line_naming_what_is_wrong(default_model):
    op = default_model.fused.layers[0]
    config = default_model.config
    k = torch.zeros(1, config.num_key_value_heads, 4, config.head_dim)
    x, angle = torch.zeros(1, config.hidden_size), torch.zeros(1, config.head_dim // 2)
    one = torch.zeros(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="writes slot 4 of store row 0 from 0, outside the cache"):
        op.forward(x, angle, angle, k, k.clone(), one, one, torch.tensor([4]))
    with pytest.raises(RuntimeError, match=r"x must be a contiguous float32 \(B, 576\) tensor"):
        op.forward(torch.zeros(1, 5), angle, angle, k, k.clone(), one, one, one)
    with pytest.raises(RuntimeError, match="k and v must be float32 stores"):
        op.forward(x, angle, angle, k[:, :1], k[:, :1].clone(), one, one, one)
    layers = kernels.load().decode_layers
    with pytest.raises(RuntimeError, match="decode_layers: one key store, value store and row per layer"):
        layers([op], x, angle, angle, [], [], [], one, one, one)
    with pytest.raises(RuntimeError, match="decode_layers: layer 0 reads row 3 of stores that lack it"):
        layers([op], x, angle, angle, [k[None]], [k[None].clone()], [3], one, one, one)
    with pytest.raises(RuntimeError, match="writes slot 4 of store row 0 from 0, outside the cache"):
        layers([op, op], x, angle, angle, [k[None]] * 2, [k[None].clone()] * 2, [0, 0], one, one, torch.tensor([4]))
    assert torch.equal(layers([op], x, angle, angle, [k[None]], [k[None].clone()], [0], one, one, one),
                       op.forward(x, angle, angle, k, k.clone(), one, one, one))
    head = default_model.fused.head
    with pytest.raises(RuntimeError, match=r"decode_logits: x must be a contiguous float32 \(B, 576\) tensor"):
        head.forward(torch.zeros(2, 5))
    with pytest.raises(RuntimeError, match="decode_layer: the final norm must be 576 float32 values"):
        kernels.load().DecodeHead(torch.ones(5), 1e-5, _linear(default_model.lm_head), kernels.best_isa())
    tokens, fused = kernels.load().decode_tokens, default_model.fused
    stores = [k[None]] * 30, [k[None].clone()] * 30, [0] * 30
    tables = default_model.rope_cos, default_model.rope_sin
    with pytest.raises(RuntimeError, match=r"dequantize: row 49152 is not in 0..49151"):
        tokens(fused.layers, fused.table, fused.head, torch.tensor([49152]), *tables, 0, *stores)
    with pytest.raises(RuntimeError, match="decode_tokens: position 8192 is outside the RoPE tables"):
        tokens(fused.layers, fused.table, fused.head, one, *tables, 8192, *stores)
    with pytest.raises(RuntimeError, match=r"decode_tokens: ids must be one int64 token per row \(B,\)"):
        tokens(fused.layers, fused.table, fused.head, one.int(), *tables, 0, *stores)
    assert tokens(fused.layers, fused.table, fused.head, one, *tables, 0, *stores).shape == (1, 1, 49152)


def slot_logits(model, prompts: list[list[int]], steps: int, fused: bool, pad_to: int) -> list[torch.Tensor]:
    """The server's way (scheduler.py): each prompt prefilled into a slot of its own, then decode
    steps over every running slot at its own length, padded with scratch rows up to pad_to."""
    from nexttok.models.slot_cache import SlotCache
    from nexttok.server.prefix_cache import prefill

    plan = model.fused
    model.fused = plan if fused else None
    try:
        cache = SlotCache.for_model(model.config, slots=pad_to, max_len=64)
        with torch.inference_mode():
            last = [prefill(model, cache, cache.claim(), ids, None).argmax().item() for ids in prompts]
            out = []
            for _ in range(steps):
                view = cache.running_view(pad_to)
                rows = [*range(len(prompts)), *[0] * (view.n - len(prompts))]
                ids = torch.tensor([[last[r]] for r in rows])
                positions = torch.tensor([[cache.lengths[r]] for r in rows])
                assert FusedDecode.takes(ids, view, None)
                logits = model(ids, view, positions, last_only=True)[:, -1]
                view.release_scratch()
                out.append(logits[: len(prompts)])
                last = logits.argmax(-1).tolist()
        return out
    finally:
        model.fused = plan


@pytest.mark.parametrize("pad_to", [2, 4])
def test_the_servers_batch_of_slots_decodes_fused_with_the_eager_logits(default_model, pad_to):
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
    fused = slot_logits(default_model, prompts, 6, fused=True, pad_to=pad_to)
    eager = slot_logits(default_model, prompts, 6, fused=False, pad_to=pad_to)
    for step, (a, b) in enumerate(zip(fused, eager, strict=True)):
        assert torch.equal(a, b), f"step {step}: fused and eager logits differ by {(a - b).abs().max():.3g}"

