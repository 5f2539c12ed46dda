"""An evaluation harness nobody here wrote, unchanged, against `nexttok serve`: lm-eval's
`local-completions` model scores (context, continuation) pairs with echo + logprobs through
/v1/completions and tokenizes through the server's own /tokenizer_info and /tokenize (its remote
tokenizer, so nothing is downloaded). The reference is HF transformers' logits of the same checkpoint."""

from __future__ import annotations

import pytest
import torch

from live_server import LiveServer
from nexttok.server import create_app

pytest.importorskip("lm_eval")

MODEL = "tiny"
PAIRS = [("The capital of France is", " Paris"), ("Once upon a time", " there was a king"),
         ("1, 2, 3,", " 4")]


def test_lm_eval_loglikelihood_equals_the_models(served, chat_model_dir):
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(chat_model_dir, torch_dtype=torch.float32).eval()
    with LiveServer(create_app([served])) as live:
        lm = LocalCompletionsAPI(base_url=live.url + "/v1/completions", model=MODEL, max_retries=1)
        assert lm.tokenizer_backend == "remote"  # found /tokenizer_info and /tokenize
        requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
        results = lm.loglikelihood(requests, disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(PAIRS, results, strict=True):
        ctx = served.tokenizer.encode(context)
        ids = ctx + served.tokenizer.encode(continuation)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
        expected = [logprobs[i - 1, ids[i]] for i in range(len(ctx), len(ids))]
        assert logprob == pytest.approx(float(sum(expected)), abs=1e-3)
        assert greedy == all(logprobs[i - 1].argmax() == ids[i] for i in range(len(ctx), len(ids)))


def test_tokenizer_info_names_the_special_tokens(served):
    import httpx

    with LiveServer(create_app([served])) as live:
        info = httpx.get(live.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == served.context_length
    assert info["chat_template"] == served.chat_template.source
