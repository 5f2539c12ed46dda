"""POST /v1/embeddings, OpenAI's Embeddings API over the loaded model.

An input's embedding is the mean over its tokens of the model's final hidden states (after the
final norm, what lm_head reads), L2-normalised: llama.cpp's `--pooling mean` (nexttok.models.pooling).
A string is encoded as /v1/completions encodes a prompt (with the tokenizer's BOS where it adds
one); token ids are taken as given.

`dimensions` is refused unless it is the model's hidden size: truncating and renormalising
(Matryoshka-style) only keeps meaning for models trained that way, and a causal LM is not, so a
shorter vector would be silently worse rather than shorter.

The forward passes run in a worker thread under the per-model lock the explainer's forwards take
(explainer.ModelState.lock), so work outside the batch scheduler runs one request at a time and
never blocks the event loop. The scheduler's own thread needs no lock: a forward without a KV
cache shares no state with it (the cache is an explicit object; the compiled step's state is
thread-local).
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Literal

import anyio
import torch
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, Field

from nexttok.errors import InvalidParameter
from nexttok.models.pooling import mean_pooled
from nexttok.server.engine import ServedModel
from nexttok.server.scheduler import RequestTimeout
from nexttok.server.schemas import Strict, TokenId

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
MAX_REQUEST_TOKENS = 300_000  # OpenAI's limit on the tokens of all inputs of one request together

Ids = Annotated[list[TokenId], Field(min_length=1)]


class CreateEmbeddingRequest(Strict):
    """OpenAI's embeddings request (openai.types.EmbeddingCreateParams); unknown fields are refused."""

    input: (str | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)] | Ids
            | Annotated[list[Ids], Field(min_length=1, max_length=MAX_INPUTS)]) = Field(
        description="a string, a list of strings, a list of token ids, or a list of lists of token ids; "
                    "no input may be empty or longer than the model's context window")
    model: str
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's little-endian float32 bytes, base64-encoded")
    dimensions: int | None = Field(None, ge=1, description="must be the model's hidden size: these vectors "
                                   "are not trained to be cut shorter (Matryoshka)")
    user: str | None = Field(None, description="accepted and ignored")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="mean-pooled final hidden states, L2-normalised")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(BaseModel):
    """What POST /v1/embeddings answers (documented, not validated: vectors can be long)."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


router = APIRouter()


@router.post("/v1/embeddings", responses={200: {"model": CreateEmbeddingResponse}})
async def embeddings(body: CreateEmbeddingRequest, request: Request):
    served = await request.app.state.pool.get(body.model)
    check_dimensions(served, body.dimensions)
    inputs = input_ids(served, body.input)
    vectors = await embed(request.app, served, inputs)
    tokens = sum(map(len, inputs))
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": served.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


async def embed(app: FastAPI, served: ServedModel, inputs: list[list[int]]) -> list[torch.Tensor]:
    """Each input's vector, in order, computed in a worker thread; past the server's request
    timeout the request ends (504). Ollama's /api/embed and /api/embeddings use it too."""
    deadline = None if app.state.limits.request_timeout is None else (
        time.monotonic() + app.state.limits.request_timeout)
    async with app.state.explainer.state(served).lock:  # forwards outside the scheduler: one at a time
        return await anyio.to_thread.run_sync(lambda: _embed_all(served, inputs, deadline))


def _embed_all(served: ServedModel, inputs: list[list[int]], deadline: float | None) -> list[torch.Tensor]:
    """Each input's vector, in order; past the server's request timeout the request ends (504)."""
    vectors = []
    for ids in inputs:
        if deadline is not None and time.monotonic() > deadline:
            raise RequestTimeout("the request took longer than the server's request timeout")
        vectors.append(mean_pooled(served.model, ids))
    return vectors


def check_dimensions(served: ServedModel, dimensions: int | None) -> None:
    """dimensions may only restate the model's hidden size (see the module's docstring for why)."""
    hidden = served.model.config.hidden_size
    if dimensions is not None and dimensions != hidden:
        raise InvalidParameter("dimensions", f"dimensions must be {hidden} (the hidden size of {served.name!r}) "
                               f"or left out, got {dimensions}: this model's embeddings are not trained to be "
                               "truncated (Matryoshka), so a shorter vector would lose meaning")


def input_ids(served: ServedModel, given: str | list[str] | list[int] | list[list[int]],
              truncate: bool = False) -> list[list[int]]:
    """Token ids of each input (the schema has bounded their number and refused empty lists):
    input_ids(served, [[5, 6], [7]]) == [[5, 6], [7]]. Errors name `input` and, in a list, the item.
    truncate: an input longer than the context window is cut to it (Ollama's default) instead."""
    single = isinstance(given, str) or all(isinstance(t, int) for t in given)
    items = [given] if single else given
    inputs = [_ids_of(served, item, "input" if single else f"input[{i}]", truncate) for i, item in enumerate(items)]
    total = sum(map(len, inputs))
    if total > MAX_REQUEST_TOKENS:
        raise InvalidParameter("input", f"the inputs are {total} tokens together; a request may have at most "
                               f"{MAX_REQUEST_TOKENS}", "context_length_exceeded")
    return inputs


def _ids_of(served: ServedModel, item: str | list[int], where: str, truncate: bool = False) -> list[int]:
    """One input's ids, checked against the vocabulary and the context window."""
    if isinstance(item, str):
        if not item:
            raise InvalidParameter("input", f"{where} is an empty string; every input needs some text")
        try:
            ids = served.tokenizer.encode(item, add_special=True)  # as /v1/completions encodes a prompt
        except ValueError as e:  # a lone surrogate: not valid Unicode
            raise InvalidParameter("input", f"{where}: {e}") from None
    else:
        ids = list(item)
        vocab = served.model.config.vocab_size
        if bad := [t for t in ids if t >= vocab]:
            raise InvalidParameter("input", f"{where} has token id {bad[0]}; ids must be in 0..{vocab - 1}")
    if not ids:  # text a normalizer strips away entirely: nothing to pool
        raise InvalidParameter("input", f"{where} encodes to no tokens")
    context = served.context_length
    if len(ids) > context and truncate:
        return ids[:context]
    if len(ids) > context:
        raise InvalidParameter("input", f"{where} is {len(ids)} tokens; the context window of {served.name!r} "
                               f"is {context}", "context_length_exceeded")
    return ids


def encode_vector(vector: torch.Tensor, encoding_format: str) -> list[float] | str:
    """A vector as the response carries it: a list of floats, or its little-endian float32 bytes in
    base64 (what the openai client decodes): encode_vector(torch.tensor([1.0]), "base64") -> 'AACAPw=='."""
    if encoding_format == "base64":
        return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
