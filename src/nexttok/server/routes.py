"""The routes around generation: the server's own (GET /health, open to all, and GET /metrics) and
OpenAI's and vLLM's model and token routes (GET /v1/models, GET /v1/models/{model}, POST /tokenize,
POST /detokenize and GET /tokenizer_info)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from nexttok.errors import InvalidParameter
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.openai_shapes import model_card, stored_card
from nexttok.server.routing import OPEN
from nexttok.server.schemas import DetokenizeRequest, TokenizeRequest

status_router = APIRouter()  # the server's own: its health and its metrics
router = APIRouter()  # OpenAI's model routes and vLLM's token routes


@status_router.get("/health", openapi_extra=OPEN)
async def health():
    return {"status": "ok"}


@status_router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request):
    return request.app.state.metrics.prometheus()


@router.get("/v1/models")
async def list_models(request: Request):
    """The loaded models, then the stored ones the server would load on first use."""
    pool = request.app.state.pool
    return {"object": "list", "data": [*(model_card(m) for m in pool.models.values()),
                                       *(stored_card(m) for m in pool.stored())]}


# :path, because served names may be hub ids ("org/name"): the client sends the slash as %2F,
# which reaches the router decoded
@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request):
    pool = request.app.state.pool
    served = pool.find(model)
    if served is not None:
        return model_card(served)
    stored = next((m for m in pool.stored() if pool.loadable(model) == m.name), None)
    if stored is None:
        raise pool.not_found(model)
    return stored_card(stored)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None):
    """vLLM's route: the special tokens and chat template a client needs to tokenize as the
    server does (with POST /tokenize; lm-eval's remote tokenizer reads both)."""
    return _tokenizer_info(await request.app.state.pool.get(model))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    served = await request.app.state.pool.get(body.model)
    ids = _tokenize(served, body)
    return {"count": len(ids), "max_model_len": served.context_length, "tokens": ids,
            "token_strs": [p.text for p in served.tokenizer.pieces(ids)]}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    served = await request.app.state.pool.get(body.model)
    try:
        return {"prompt": served.tokenizer.decode(body.tokens)}
    except ValueError as e:
        raise InvalidParameter("tokens", str(e)) from None


def _tokenize(served: ServedModel, body: TokenizeRequest) -> list[int]:
    """Ids of the body's prompt, or of its messages rendered by the model's chat template."""
    if (body.prompt is None) == (body.messages is None):
        raise InvalidParameter("prompt", "give exactly one of prompt or messages")
    if body.messages is None:
        return served.tokenizer.encode(body.prompt, add_special=body.add_special_tokens)
    if served.chat_template is None:
        raise APIError(400, f"model {served.name!r} has no chat template", param="messages")
    text = served.chat_template.render(body.messages, add_generation_prompt=body.add_generation_prompt)
    return served.tokenizer.encode(text)


def _tokenizer_info(served: ServedModel) -> dict:
    config, tokenizer = served.model.config, served.tokenizer

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.decode([token_id])
    return {"model": served.name, "tokenizer_class": "nexttok", "vocab_size": tokenizer.vocab_size,
            "model_max_length": served.context_length, "bos_token": text(config.bos_token_id),
            "eos_token": text(config.eos_token_id[0] if config.eos_token_id else None), "pad_token": None,
            "add_bos_token": bool(tokenizer.encode("", add_special=True)),
            "chat_template": served.chat_template.source if served.chat_template is not None else None}
