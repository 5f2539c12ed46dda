"""POST /v1/embeddings through the official `openai` client on a live server: the vectors are the
mean-pooled final hidden states of HF transformers' model (the oracle, run in the same test),
L2-normalised; formats, batches and token-id inputs agree; bad requests are 400s naming the field."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
import transformers

from live_server import LiveServer
from nexttok.checkpoints.loading import load_model
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams
from nexttok.server import ServerLimits, create_app
from tiny_models import write_tiny

MODEL = "tiny"
TEXTS = ["Once upon a time", "The weather is nice today.", "a", "tokens, tokens and more tokens"]
HIDDEN = 64  # the test model's hidden size


def _vectors(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float64)


def _hf_pooled(hf, ids: list[int]) -> torch.Tensor:
    """The reference: HF's last hidden state (checked to be post-norm: lm_head of it is the
    logits), mean-pooled over the tokens, L2-normalised."""
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
        last = out.hidden_states[-1][0]  # (T, hidden)
        torch.testing.assert_close(hf.lm_head(last), out.logits[0], atol=1e-5, rtol=1e-5)
    return F.normalize(last.mean(0), dim=0)


def test_embeddings_equal_mean_pooled_transformers_hidden_states(client, served, chat_model_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(chat_model_dir, attn_implementation="eager").eval()
    response = client.embeddings.create(model=MODEL, input=TEXTS)
    got = _vectors(response)
    assert got.shape == (len(TEXTS), HIDDEN) and response.model == MODEL and response.object == "list"
    for text, vector in zip(TEXTS, got, strict=True):
        expected = _hf_pooled(hf, served.tokenizer.encode(text, add_special=True)).numpy()
        np.testing.assert_allclose(vector, expected, atol=1e-5, rtol=0)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", ["gpt2", "gemma3", "qwen3"])
@torch.inference_mode()
def test_final_hidden_is_transformers_last_hidden_state(tmp_path, name):
    """Every architecture's final_hidden (what the server pools) is HF's post-norm last hidden state."""
    hf = write_tiny(name, tmp_path)
    ours = load_model(tmp_path)
    ids = torch.randint(0, ours.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    out = hf(ids, output_hidden_states=True)
    torch.testing.assert_close(hf.lm_head(out.hidden_states[-1]), out.logits, atol=1e-5, rtol=1e-5)  # post-norm
    torch.testing.assert_close(ours.final_hidden(ids), out.hidden_states[-1], atol=1e-5, rtol=1e-5)


def test_float_and_base64_give_the_same_vectors(client):
    floats = _vectors(client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float"))
    raw = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])
    default = _vectors(client.embeddings.create(model=MODEL, input=TEXTS))  # the client asks base64, decodes it
    assert all(isinstance(d.embedding, str) for d in raw.data)
    np.testing.assert_array_equal(decoded, floats)
    np.testing.assert_array_equal(default, floats)


def test_a_batch_equals_each_input_alone(client):
    batch = _vectors(client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float"))
    for i, text in enumerate(TEXTS):
        alone = _vectors(client.embeddings.create(model=MODEL, input=text, encoding_format="float"))
        np.testing.assert_array_equal(alone[0], batch[i])


def test_token_ids_equal_the_strings_ids_and_usage_counts_tokens(client, served):
    ids = [served.tokenizer.encode(text, add_special=True) for text in TEXTS]
    by_text = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    one = client.embeddings.create(model=MODEL, input=ids[1], encoding_format="float")
    np.testing.assert_array_equal(_vectors(by_ids), _vectors(by_text))
    np.testing.assert_array_equal(_vectors(one)[0], _vectors(by_text)[1])
    total = sum(map(len, ids))
    assert by_text.usage.prompt_tokens == by_text.usage.total_tokens == by_ids.usage.prompt_tokens == total
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(ids[1])


def test_user_and_the_hidden_size_as_dimensions_are_accepted(client):
    from openai.types import embedding_create_params

    # every field OpenAI documents for the route is used in this file (a new one fails here)
    assert set(embedding_create_params.EmbeddingCreateParams.__annotations__) == {
        "input", "model", "encoding_format", "dimensions", "user"}
    plain = _vectors(client.embeddings.create(model=MODEL, input="hello", encoding_format="float"))
    both = _vectors(client.embeddings.create(model=MODEL, input="hello", encoding_format="float",
                                             dimensions=HIDDEN, user="someone"))
    np.testing.assert_array_equal(plain, both)


def test_embeddings_beside_running_completions(client, served):
    """Embeddings (outside the scheduler, in a thread) while the scheduler generates: both give
    what they give alone."""
    alone = _vectors(client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float"))
    expected = generate(served.model, served.tokenizer, "Once upon a time", SamplingParams(seed=4), max_tokens=24)

    def complete():
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, seed=4)

    def embed():
        return _vectors(client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float"))

    with ThreadPoolExecutor(6) as pool:
        completions = [pool.submit(complete) for _ in range(2)]
        embedded = [pool.submit(embed) for _ in range(4)]
        for future in embedded:
            np.testing.assert_array_equal(future.result(), alone)
        assert [f.result().choices[0].text for f in completions] == [expected.text] * 2


TOO_MANY = [[1]] * 2049
BAD = [
    ({"input": ""}, "input", "empty string"),
    ({"input": []}, "input", "at least 1 item"),
    ({"input": [""]}, "input", "input[0] is an empty string"),
    ({"input": ["fine", ""]}, "input", "input[1] is an empty string"),
    ({"input": [[]]}, "input", "at least 1 item"),
    ({"input": [5, 50257]}, "input", "token id 50257; ids must be in 0..50256"),
    ({"input": [[5], [7, 99999]]}, "input", "input[1] has token id 99999"),
    ({"input": [-1]}, "input", "greater than or equal to 0"),
    ({"input": "x " * 5000}, "input", "the context window of 'tiny' is 4096"),
    ({"input": [list(range(4097))]}, "input", "input[0] is 4097 tokens"),
    ({"input": TOO_MANY}, "input", "at most 2048 items"),
    ({"input": ["a", 1]}, "input", "Invalid value for input"),
    ({"input": 7}, "input", "Invalid value for input"),
    ({"input": "\ud800"}, "input", "lone surrogate"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "hi", "dimensions": 32}, "dimensions", "dimensions must be 64"),
    ({"input": "hi", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "hi", "dimensions": "64"}, "dimensions", "valid integer"),
    ({"input": "hi", "pooling": "cls"}, "pooling", "Unrecognized request argument supplied: pooling"),
    ({"input": "hi", "model": None}, "model", "valid string"),
]


@pytest.mark.parametrize(("fields", "param", "message"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_are_400_naming_the_field(server, fields, param, message):
    body = {"model": MODEL, **fields}
    response = httpx.post(server.url + "/v1/embeddings", content=json.dumps(body),
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert message in error["message"]


def test_missing_fields_and_unknown_models(server, client):
    response = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    response = httpx.post(server.url + "/v1/embeddings", json={"input": "hi"}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
    with pytest.raises(openai.NotFoundError) as error:
        client.embeddings.create(model="no-such-model", input="hi")
    assert error.value.body["param"] == "model" and error.value.body["code"] == "model_not_found"


def test_past_the_request_timeout_is_a_504(served):
    """The embeddings route keeps the server's request timeout as generation does."""
    with LiveServer(create_app([served], limits=ServerLimits(request_timeout=1e-9))) as live:
        response = httpx.post(live.url + "/v1/embeddings", json={"model": MODEL, "input": TEXTS}, timeout=60)
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"


def test_openapi_lists_the_route_with_its_body(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=60).json()
    operation = spec["paths"]["/v1/embeddings"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateEmbeddingRequest"}
    fields = spec["components"]["schemas"]["CreateEmbeddingRequest"]
    assert set(fields["properties"]) == {"input", "model", "encoding_format", "dimensions", "user"}
    assert set(fields["required"]) == {"input", "model"} and fields["additionalProperties"] is False
    assert "400" in operation["responses"] and "422" not in operation["responses"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CreateEmbeddingResponse"}
