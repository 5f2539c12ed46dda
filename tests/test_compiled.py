"""The compiled decode step (models/compiled.py): as exact as the eager one against HF, the same
tokens with the cache on and off and alone or in a batch, and one clear line where it cannot run."""

from __future__ import annotations

import pytest
import torch

from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.models import compiled
from nexttok.models.cache import KVCache
from nexttok.models.compiled import compile_decode
from tiny_models import VOCAB, write_tiny

ATOL = 1e-4


@pytest.fixture(scope="module", params=["llama_gqa_llama3_rope", "gpt2"])
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = write_tiny(request.param, directory)
    model = load_model(directory)
    compile_decode(model)
    return hf, model


@torch.inference_mode()
def test_compiled_steps_match_hf(pair):
    hf, ours = pair
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=32)
    ours(ids[:, :8], cache)  # prefill: eager
    for t in range(8, 20):
        step = ours(ids[:, t : t + 1], cache)
        torch.testing.assert_close(step[:, 0], expected[:, t], atol=ATOL, rtol=0)
    assert ours.compiled.compiled_rows == {1} and ours.compiled.compile_seconds > 0  # the steps ran compiled


@pytest.fixture(scope="module")
def chat(chat_model_dir):
    """The servers' test model (tiny Llama with a GPT-2 vocabulary), decode steps compiled."""
    return load_checkpoint(chat_model_dir, compile=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_seed_same_tokens_with_the_cache_on_and_off(chat, temperature):
    """With the cache, steps run compiled; without it, every step is an eager prefill."""
    params = SamplingParams(temperature=temperature, seed=7)
    runs = [generate(chat.model, chat.tokenizer, "Once upon a time", params, max_tokens=16, stop_token_ids=[],
                     use_cache=cache).token_ids for cache in (True, False)]
    assert runs[0] == runs[1]
    assert chat.model.compiled.compiled_rows == {1}


def test_a_compiled_server_gives_the_same_tokens_alone_and_in_a_batch_of_8(chat_model_dir):
    """A compiled model always decodes max_running rows (one shape, one graph), so a request's
    rows meet the same kernels alone as in any batch."""
    from concurrent.futures import ThreadPoolExecutor

    from live_server import LiveServer
    from nexttok.server import ServerLimits, create_app, load_served
    from test_batching import MODEL, REQUESTS, _complete

    served = load_served(str(chat_model_dir), MODEL, dtype="int4", compile=True)
    with LiveServer(create_app([served], limits=ServerLimits(max_running=8))) as live:
        assert live.server.app.state.models[MODEL].scheduler.pad_to == 8
        alone = [_complete(live.url, **body).json()["choices"][0]["text"] for body in REQUESTS]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda b: _complete(live.url, **b).json()["choices"][0]["text"], REQUESTS))
    assert alone == together
    assert served.model.compiled.compiled_rows == {8}


def test_without_a_compiler_one_line_and_the_model_runs(chat_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    checkpoint = load_checkpoint(chat_model_dir, compile=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no C++ compiler found" in err
    assert checkpoint.model.compiled is None
    assert generate(checkpoint.model, checkpoint.tokenizer, "Hi", SamplingParams(temperature=0), max_tokens=3).text
