"""What a user test with the official `openai` client found: streamed text_offset, models.retrieve,
the Bearer scheme in any case and the 401 challenge, and clear errors for a body sent with the wrong
Content-Type or no body at all. One key-protected server holds the test model under two names, one
with a slash as hub ids have."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from live_server import LiveServer
from nexttok.server import ServedModel, ServerLimits, create_app

MODEL = "tiny"
HUB_NAME = "org/tiny-chat"  # served names may be hub ids
KEY = "sk-client-test"


@pytest.fixture(scope="module")
def live(served):
    twin = ServedModel(HUB_NAME, served.model, served.tokenizer, served.chat_template)  # same weights
    with LiveServer(create_app([served, twin], api_key=KEY, limits=ServerLimits(max_running=2))) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)


def _post(live, path, content: bytes, headers: dict) -> httpx.Response:
    return httpx.post(live.url + path, content=content, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", **headers})


def test_streamed_text_offset_is_the_running_offset(client):
    """Each chunk's text_offset is where its text starts in its choice's whole text (it was [0] in
    every chunk); streamed, the offsets are those of the whole response."""
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=7, n=2, logprobs=1)
    whole = client.completions.create(**args)
    texts, offsets = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in client.completions.create(**args, stream=True):
        choice = chunk.choices[0]
        assert choice.logprobs.text_offset == [len(texts[choice.index])]
        texts[choice.index] += choice.text
        offsets[choice.index] += choice.logprobs.text_offset
    for choice in whole.choices:
        assert texts[choice.index] == choice.text
        assert offsets[choice.index] == choice.logprobs.text_offset
        assert len(choice.logprobs.tokens) == 12 and offsets[choice.index][-1] > 0


def test_models_retrieve(client, live):
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {MODEL, HUB_NAME}
    for name in (MODEL, HUB_NAME):  # the client sends HUB_NAME's slash as %2F
        model = client.models.retrieve(name)
        assert model.id == name and model.object == "model" and model.owned_by == "nexttok"
        assert model == listed[name]
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("no-such-model")
    body = error.value.body
    assert body["param"] == "model" and body["code"] == "model_not_found" and body["type"] == "invalid_request_error"
    assert "'no-such-model' does not exist" in body["message"]
    spec = httpx.get(live.url + "/openapi.json").json()
    operation = spec["paths"]["/v1/models/{model}"]["get"]
    assert "404" in operation["responses"] and "401" in operation["responses"]
    assert [p["name"] for p in operation["parameters"]] == ["model"]


@pytest.mark.parametrize("authorization", [f"bearer {KEY}", f"BEARER {KEY}", f"bEaReR   {KEY}"])
def test_the_bearer_scheme_is_case_insensitive(live, authorization):
    """RFC 7235: the auth scheme is case-insensitive (and one or more spaces end it)."""
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"Authorization": authorization})
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_a_401_carries_the_bearer_challenge(live):
    wrong = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as error:
        wrong.models.retrieve(MODEL)
    assert error.value.response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert error.value.body["code"] == "invalid_api_key"
    for headers in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}, {"Authorization": KEY}):
        response = httpx.get(live.url + "/v1/models", headers=headers)
        assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer", headers
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    assert httpx.get(live.url + "/health").status_code == 200


def test_json_sent_as_text_plain_says_the_content_type(client, live):
    """Like vLLM, the body must be sent as application/json (OpenAI does not read it either, and
    then says a parameter is missing); the error says which header was sent."""
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_headers={"Content-Type": "text/plain"})
    assert error.value.body["message"] == "Content-Type must be application/json, got text/plain"
    assert error.value.body["param"] is None and error.value.body["type"] == "invalid_request_error"
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    no_type = _post(live, "/v1/completions", body, {})
    assert no_type.status_code == 400
    assert no_type.json()["error"]["message"] == "Content-Type must be application/json, got none"
    with_charset = _post(live, "/v1/completions", body, {"Content-Type": "application/json; charset=utf-8"})
    assert with_charset.status_code == 200, with_charset.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_an_empty_body_says_it_is_empty(live, path):
    for headers in ({"Content-Type": "application/json"}, {}):
        response = _post(live, path, b"", headers)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["message"].startswith("request body is empty") and error["param"] is None
    null = _post(live, path, b"null", {"Content-Type": "application/json"})
    assert null.status_code == 400 and null.json()["error"]["message"] == "request body must be a JSON object"
