"""The OpenAI-compatible HTTP server (FastAPI), wired from the modules beside this one.

Routes: POST /v1/completions, POST /v1/chat/completions (completions.py), POST /v1/responses and
GET/DELETE /v1/responses/{id} (responses_api.py), POST /v1/messages and /v1/messages/count_tokens
(Anthropic's Messages API, anthropic.py), POST /v1/embeddings (embeddings.py), GET /v1/models (and /{model}),
POST /tokenize, POST /detokenize, GET /health, GET /metrics (routes.py), Ollama's native API under
/api (ollama.py), the explainer page and its API (lesson/routes.py): one route table per API
(ROUTE_TABLES), whose routes say themselves whether they stream and whether they are open
(routing.py). The models: the ones it was started with, and those it loads on first use and
unloads when idle (pool.py). Errors use OpenAI's shape {"error": {"message", "type", "param",
"code"}} (errors.py), Anthropic's and Ollama's on their routes; client mistakes are 4xx, never
500. Every request is logged (logs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from nexttok.generation.loop import context_window
from nexttok.server import anthropic, completions, embeddings, ollama, responses_api, routes
from nexttok.server.auth import install_api_key
from nexttok.server.engine import ServedModel, find_served, load_served
from nexttok.server.errors import install_error_handlers
from nexttok.server.lesson.routes import install_explainer
from nexttok.server.limits import BodyLimit, ServerLimits, json_text_is_unicode
from nexttok.server.logs import RequestLog
from nexttok.server.metrics import Metrics
from nexttok.server.openapi import openapi_spec
from nexttok.server.pool import ModelPool, stored_name
from nexttok.server.scheduler import Scheduler

# one route table per API, by the tag /openapi.json groups its routes under (the explainer's is
# built with its state: lesson/routes.py)
ROUTE_TABLES = {"OpenAI": [completions.router, embeddings.router, routes.router],
                "Responses": [responses_api.router], "Anthropic": [anthropic.router], "Ollama": [ollama.router],
                "Server": [routes.status_router]}
# the paths (a prefix and those under it) that answer errors in another API's shape than OpenAI's
ERROR_SHAPES = {anthropic.MESSAGES: anthropic.ANTHROPIC_ERRORS, ollama.PREFIX: ollama.OLLAMA_ERRORS}


@asynccontextmanager
async def _lifespan(app: FastAPI):
    reaper = asyncio.create_task(app.state.pool.reap_forever())  # unloads models past their keep_alive
    yield
    reaper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reaper
    app.state.shutdown()  # ends every stream still open with a clean error event


def create_app(models: list[ServedModel], *, api_key: str | None = None,
               limits: ServerLimits | None = None, start_schedulers: bool = True,
               loader: Callable[[str], ServedModel] = load_served,
               loadable: Callable[[str], str | None] = stored_name) -> FastAPI:
    """The app; each model's batch scheduler starts in a thread of its own unless
    start_schedulers=False (then the caller runs one with scheduler.run(), see nexttok serve).
    Other models load on first use (pool.py): loadable(name) says under which name, if any,
    loader(name) loads it; limits.keep_alive and max_loaded say how long and how many stay."""
    if not models:
        raise ValueError("a server needs at least one model")
    limits = limits or ServerLimits()
    app = FastAPI(title="nexttok", version="0.1.0", lifespan=_lifespan,
                  description="OpenAI-compatible text generation, one token at a time.",
                  dependencies=[Depends(json_text_is_unicode)])
    app.state.metrics = Metrics()
    app.state.limits = limits
    _attach_schedulers(models, limits, app.state.metrics, start=start_schedulers)
    app.state.pool = ModelPool(
        models, loader=loader, loadable=loadable, keep_alive=limits.keep_alive, max_loaded=limits.max_loaded,
        attach=lambda served: _attach_schedulers([served], limits, app.state.metrics, start=False),
        timeout=limits.request_timeout)
    app.state.models = app.state.pool.models  # the loaded models, by name (the pool adds and removes them)
    app.state.shutdown = app.state.pool.stop_all
    app.state.request_stop = app.state.pool.request_stop_all
    install_error_handlers(app)
    install_api_key(app, api_key)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(RequestLog)  # added last, so outermost: it sees every answer, a 401 or 413 too
    app.state.error_shapes = dict(ERROR_SHAPES)
    app.state.responses = responses_api.response_store()
    for api, tables in ROUTE_TABLES.items():
        for table in tables:
            app.include_router(table, tags=[api])
    install_explainer(app, lambda name: find_served(app.state.models, name))
    app.openapi = lambda: openapi_spec(app, api_key is not None)
    return app


def _attach_schedulers(models: list[ServedModel], limits: ServerLimits, metrics: Metrics, *, start: bool) -> None:
    """A batch scheduler for each model, sized by the limits and the model's own context."""
    for served in models:
        served.scheduler = Scheduler(served.model, max_running=limits.max_running, max_queue=limits.max_queue,
                                     max_len=context_window(served.model.config, limits.max_model_len),
                                     timeout=limits.request_timeout, metrics=metrics,
                                     batch_invariant=limits.batch_invariant,
                                     prefix_cache_tokens=limits.prefix_cache_tokens)
        if start:
            served.scheduler.start()
