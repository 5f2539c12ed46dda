"""The routes around generation: GET /health, GET /metrics, GET /v1/models, GET /v1/models/{model},
POST /tokenize and POST /detokenize."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from nexttok.errors import InvalidParameter
from nexttok.server.engine import ServedModel, find_served
from nexttok.server.errors import APIError
from nexttok.server.responses import model_card
from nexttok.server.schemas import DetokenizeRequest, TokenizeRequest


def install_routes(app: FastAPI) -> None:
    _install_status_routes(app)
    _install_token_routes(app)


def _install_status_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return app.state.metrics.prometheus()

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(m) for m in app.state.models.values()]}

    # :path, because served names may be hub ids ("org/name"): the client sends the slash as %2F,
    # which reaches the router decoded
    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str):
        return model_card(find_served(app.state.models, model))


def _install_token_routes(app: FastAPI) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        served = find_served(app.state.models, body.model)
        ids = _tokenize(served, body)
        return {"count": len(ids), "max_model_len": served.context_length, "tokens": ids,
                "token_strs": [p.text for p in served.tokenizer.pieces(ids)]}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        served = find_served(app.state.models, body.model)
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
