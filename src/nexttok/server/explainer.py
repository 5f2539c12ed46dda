"""Routes of the explainer page: the static page at /, and a small session API under /explain.

POST /explain/sessions             {prompt, model?, seed?}  -> prompt tokens, model facts, session id
POST /explain/sessions/{id}/step   {temperature, top_k, top_p, min_p, repetition_penalty, node?, token_id?}
                                   -> the Step record, raw logits, draw, attention, timing, the tree
POST /explain/sessions/{id}/goto   {node}  -> makes a node of the tree current
DELETE /explain/sessions/{id}
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from pydantic import Field

from nexttok.explain import ExplainSession
from nexttok.sampling import SamplingParams
from nexttok.server.app import APIError
from nexttok.server.schemas import Strict

STATIC = Path(__file__).parent / "static"
MAX_SESSIONS = 8


class SessionRequest(Strict):
    prompt: str
    model: str | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)


class GotoRequest(Strict):
    node: int


class StepRequest(Strict):
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=100)
    node: int | None = Field(None, ge=0)
    token_id: int | None = Field(None, ge=0)
    top_n: int = Field(10, ge=1, le=50)


def install_explainer(app: FastAPI, served_for) -> None:
    """Add the page and its API; served_for(name) resolves a model as the OpenAI routes do."""
    sessions: OrderedDict[str, tuple] = OrderedDict()
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.post("/explain/sessions")
    async def start(body: SessionRequest):
        served = served_for(body.model)
        async with served.lock:
            session = await anyio.to_thread.run_sync(
                lambda: ExplainSession(served.model, served.tokenizer, body.prompt, seed=body.seed))
        key = uuid.uuid4().hex
        sessions[key] = (served, session)
        while len(sessions) > MAX_SESSIONS:  # the oldest session goes
            sessions.popitem(last=False)
        config = served.model.config
        facts = {"name": served.name, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
                 "vocab_size": config.vocab_size, "context": session.cache.max_len}
        return {"session": key, "vocab": _vocab(served), "model": facts,
                "prompt": _chips(served.tokenizer, session.prompt_ids), "tree": session.tree()}

    @app.post("/explain/sessions/{key}/step")
    async def step(key: str, body: StepRequest):
        served, session = _session(sessions, key)
        params = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                min_p=body.min_p, repetition_penalty=body.repetition_penalty)
        async with served.lock:
            view = await anyio.to_thread.run_sync(
                lambda: session.step(params, body.node, body.token_id, body.top_n))
        view["step"] = dataclasses.asdict(view["step"])
        path = session.path(view["child"])
        return {**view, "tree": session.tree(), "current": session.current,
                "generated": _chips(served.tokenizer, path), "text": session.text(view["child"])}

    @app.post("/explain/sessions/{key}/goto")
    async def goto(key: str, body: GotoRequest):
        served, session = _session(sessions, key)
        session.goto(body.node)
        return {"tree": session.tree(), "current": session.current, "text": session.text(session.current),
                "generated": _chips(served.tokenizer, session.path(session.current))}

    @app.delete("/explain/sessions/{key}")
    async def stop(key: str):
        _session(sessions, key)
        del sessions[key]
        return {"deleted": key}


def _session(sessions, key: str):
    if key not in sessions:
        raise APIError(404, f"no explainer session {key!r} (it may have expired)", param="session",
                       code="session_not_found")
    sessions.move_to_end(key)
    return sessions[key]


def _vocab(served) -> list[str]:
    """Display text of every id the model can produce (computed once per model)."""
    if served.vocab_texts is None:
        tokenizer, size = served.tokenizer, served.model.config.vocab_size
        known = min(size, tokenizer.vocab_size)
        texts = []
        for i in range(known):
            try:
                texts.append(tokenizer.pieces([i])[0].text)
            except ValueError:  # a hole in the vocabulary
                texts.append(f"<{i}>")
        served.vocab_texts = texts + [f"<{i}>" for i in range(known, size)]
    return served.vocab_texts


def _chips(tokenizer, ids: list[int]) -> list[dict]:
    return [{"id": p.id, "text": p.text, "bytes": p.bytes.hex(" ")} for p in tokenizer.pieces(ids)]
