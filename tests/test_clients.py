"""A framework's client nobody here wrote, unchanged, against `nexttok serve`'s routes: LangChain's
ChatOpenAI (chat completions and, with use_responses_api, the Responses API) and OpenAIEmbeddings.
Each answer is checked against the route it went through, called directly with the openai client."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

langchain_openai = pytest.importorskip("langchain_openai")

MODEL = "tiny"


class City(BaseModel):
    """A city to look up."""

    city: Literal["Paris", "Rome"]


def pick_city(city: Literal["Paris", "Rome"]) -> str:
    """Look up a city's weather."""
    return city


def _chat_model(server, **kwargs):
    return langchain_openai.ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                       temperature=0, **kwargs)


@pytest.mark.parametrize("responses_api", [False, True])
def test_invoke_and_stream_are_the_routes_answer(server, client, responses_api):
    llm = _chat_model(server, max_tokens=8, use_responses_api=responses_api)
    answer = llm.invoke("Tell me a story")
    direct = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}],
                                            max_tokens=8, temperature=0).choices[0].message.content
    assert answer.text == direct
    assert "".join(chunk.text for chunk in llm.stream("Tell me a story")) == direct


@pytest.mark.parametrize("responses_api", [False, True])
def test_bind_tools_any_gives_one_parsed_call(server, responses_api):
    llm = _chat_model(server, max_tokens=200, use_responses_api=responses_api).bind_tools([pick_city],
                                                                                           tool_choice="any")
    message = llm.invoke("Weather in Paris?")
    assert len(message.tool_calls) == 1, message
    assert message.tool_calls[0]["name"] == "pick_city" and message.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    assert "tool_calls" not in message.text


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(server, method):
    # strict: the schema says additionalProperties false (a random test model would otherwise
    # write extra keys until max_tokens, as the schema allows)
    reply = _chat_model(server, max_tokens=200).with_structured_output(City, method=method, strict=True).invoke(
        "Which city?")
    assert isinstance(reply, City) and reply.city in ("Paris", "Rome")


def test_embeddings_are_the_routes_vectors(server, client):
    embeddings = langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=server.url + "/v1", api_key="unused",
                                                   check_embedding_ctx_length=False, max_retries=0)
    texts = ["a king", "a queen"]
    vectors = embeddings.embed_documents(texts)
    direct = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    for ours, theirs in zip(vectors, direct.data, strict=True):
        assert ours == pytest.approx(theirs.embedding, abs=1e-6)
    assert embeddings.embed_query("a king") == pytest.approx(vectors[0], abs=1e-6)
