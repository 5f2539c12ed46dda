"""Routes of the explainer page: the static page at /, and a small session API under /explain.

GET /explain/parameters            -> each dial's range, default and meaning; the default order
GET /explain/vocab?model=          -> the display text of every token id (once per page load: an ETag)
POST /explain/sessions             {prompt, model?, seed?}  -> prompt tokens, model facts, session id;
                                      model.moe: a mixture of experts' parameters per token, total vs
                                      active (lesson.experts.ExpertFacts; null for a dense model);
                                      model.layer_types: per layer {layer, kind, recurrent, window,
                                      state} (lesson.layers.LayerKind: a recurrent layer's state
                                      {numbers, bytes, inputs, parts}, measured on the model)
POST /explain/sessions/{id}/step   {dials, node?, token_id?, top_n?}
                                   -> the Step record, rows, attention (and its mean over the heads)
                                      per attention layer, attention_layers (the model's layer of
                                      each), experts (per sparse layer, the router at the position the
                                      step predicts from: {layer, ids, weights, probs}; null for a dense
                                      model), timing, cache (cache.held: bytes per layer type at this
                                      length, lesson.layers.CacheMemory; cache.full_context: the same
                                      at the model's context window), the tree
POST /explain/sessions/{id}/redraw {dials, node, top_n?}
                                   -> the Step the same u gives under these dials, rows (no new node)
POST /explain/sessions/{id}/goto   {node}  -> makes a node of the tree current
DELETE /explain/sessions/{id}

dials: every number setting of every sampler stage (nexttok.generation.stages) and order, with the
ranges of nexttok.generation.parameters.PARAMETERS; GET /explain/parameters lists them, and per stage
its settings and when people use it. rows: the model's top_n tokens with their probability before (p)
and after (q) the sampler chain.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, FastAPI, Header, Response
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from pydantic import Field, create_model

from nexttok.generation.parameters import DIALS, PARAMETERS
from nexttok.generation.sampling import DEFAULT_ORDER, STAGE_NAMES, SamplingParams
from nexttok.generation.stages import SETTINGS, STAGES
from nexttok.lesson import sections as lesson
from nexttok.lesson.experts import expert_facts
from nexttok.lesson.session import ExplainSession
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.lesson.sections import install_lesson, round5
from nexttok.server.routing import OPEN
from nexttok.server.schemas import Strict, bounded

STATIC = Path(__file__).parent / "static"
VOCAB_CACHING = "no-cache"  # a copy may be kept, and is checked with If-None-Match before each use
MAX_SESSIONS = 8
MAX_CONTEXT = 4096

ServedFor = Callable[[str | None], ServedModel]  # a model name (None: the only one) -> the model


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """GET /explain/vocab's answer for one model, built once: the JSON body and its ETag."""

    body: bytes
    etag: str


@dataclasses.dataclass
class ModelState:
    """What the explainer keeps per served model."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # sessions run one at a time
    vocab: Vocabulary | None = None  # display text of every id, for the page


class VocabResponse(Strict):
    """The display text of every token id of a model: texts[id] for ids 0..vocab_size-1."""

    model: str
    vocab_size: int
    texts: list[str] = Field(description="an id the tokenizer lacks (a padding row) shows as <id>")


@dataclasses.dataclass
class OpenSession:
    """An explainer session and the served model it runs on."""

    served: ServedModel
    session: ExplainSession


class SessionRequest(Strict):
    prompt: str
    model: str | None = None
    seed: int | None = bounded("seed")
    context: int | None = Field(None, ge=2, le=MAX_CONTEXT, description="the session's context window in tokens "
                                "(default: the model's, at most 1024); small ones show a window filling up")


class GotoRequest(Strict):
    node: int


class DialSettings(Strict):
    def params(self) -> SamplingParams:
        return SamplingParams(**{name: getattr(self, name) for name in DIALS}, order=self.order)


# The sampler settings of the page's dials: every number setting of every stage, with its range and
# (as the default) the library's neutral value; the order of the stages; rows in the table.
Dials = create_model(
    "Dials", __base__=DialSettings,
    **{name: (SETTINGS[name].annotation, bounded(name, SETTINGS[name].default)) for name in DIALS},
    order=(Annotated[list[str], Field(max_length=len(STAGE_NAMES))], list(DEFAULT_ORDER)),
    top_n=(int, Field(10, ge=1, le=50)))


class StepRequest(Dials):
    node: int | None = Field(None, ge=0)
    token_id: int | None = Field(None, ge=0)
    use_cache: bool = Field(True, description="false: run the whole sequence through the model again")


class RedrawRequest(Dials):
    node: int = Field(ge=0)


class ModuleFiles(StaticFiles):
    """The page's static files, each .js as text/javascript whatever the system's MIME table says: a
    browser runs an ES module only when its type is JavaScript (Windows' registry can say text/plain)."""

    def file_response(self, full_path, stat_result, scope, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        if str(full_path).endswith(".js") and "content-type" in response.headers:  # not on a 304
            response.headers["content-type"] = "text/javascript; charset=utf-8"
        return response


class Explainer:
    """The explainer's state: open sessions (past MAX_SESSIONS the oldest goes) and, per served
    model, a ModelState."""

    def __init__(self, served_for: ServedFor):
        self.served_for = served_for  # name -> ServedModel, as the OpenAI routes resolve it
        self.sessions: OrderedDict[str, OpenSession] = OrderedDict()
        self.models: dict[str, ModelState] = {}

    def state(self, served: ServedModel) -> ModelState:
        return self.models.setdefault(served.name, ModelState())

    def add(self, served: ServedModel, session: ExplainSession) -> str:
        key = uuid.uuid4().hex
        self.sessions[key] = OpenSession(served, session)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return key

    def session(self, key: str) -> OpenSession:
        if key not in self.sessions:
            raise APIError(404, f"no explainer session {key!r} (it may have expired)", param="session",
                           code="session_not_found")
        self.sessions.move_to_end(key)
        return self.sessions[key]


def install_explainer(app: FastAPI, served_for: ServedFor) -> None:
    """Add the page and its API; served_for(name) resolves a model as the OpenAI routes do."""
    explainer = Explainer(served_for)
    app.state.explainer = explainer
    app.mount("/static", ModuleFiles(directory=STATIC), name="static")  # open, as the page is (routing.is_open)
    router = APIRouter()

    @router.get("/", include_in_schema=False, openapi_extra=OPEN)
    async def page():
        return FileResponse(STATIC / "index.html")

    @router.get("/explain/parameters")
    async def parameters():
        return {"dials": {name: PARAMETERS[name].as_json() for name in DIALS}, "order": list(DEFAULT_ORDER),
                "stages": [{"name": spec.name, "use": spec.use, "settings": list(spec.settings),
                            "dials": [name for name in spec.settings if name in DIALS], "last": spec.last,
                            "greedy": spec.greedy, "needs": sorted(spec.needs)} for spec in STAGES]}

    @router.post("/explain/sessions")
    async def start(body: SessionRequest):
        served = explainer.served_for(body.model)
        async with explainer.state(served).lock:
            session = await anyio.to_thread.run_sync(
                lambda: ExplainSession(served.model, served.tokenizer, body.prompt, seed=body.seed,
                                       max_len=body.context or 1024))
        key = explainer.add(served, session)
        config = served.model.config
        facts = {"name": served.name, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
                 "vocab_size": config.vocab_size, "context": session.cache.max_len,
                 "moe": _moe_facts(served.model), "layer_types": [layer.as_json() for layer in session.layers]}
        return {"session": key, "model": facts, "prompt": _chips(served.tokenizer, session.prompt_ids),
                "tree": session.tree()}

    @router.delete("/explain/sessions/{key}")
    async def stop(key: str):
        explainer.session(key)
        del explainer.sessions[key]
        return {"deleted": key}

    _install_vocab_route(router, explainer)
    _install_step_routes(router, explainer)
    install_lesson(router, explainer)
    app.include_router(router, tags=["Explainer"])


def _install_vocab_route(router: APIRouter, explainer: Explainer) -> None:
    @router.get("/explain/vocab", response_model=VocabResponse,
             responses={304: {"description": "If-None-Match names the current ETag: the copy the client "
                                             "holds is still the model's vocabulary"}})
    async def vocabulary(model: str | None = None,
                         if_none_match: Annotated[str | None, Header(description="an ETag this route sent")] = None):
        """The display text of every token id of the model, for the page's tables (a session's
        answers name ids). Fetched once per page load instead of with each session: it is sent with
        an ETag and Cache-Control: no-cache, so a reload asks again with If-None-Match and gets 304."""
        served = explainer.served_for(model)
        state = explainer.state(served)
        if state.vocab is None:
            state.vocab = await anyio.to_thread.run_sync(lambda: _vocabulary(served))
        headers = {"ETag": state.vocab.etag, "Cache-Control": VOCAB_CACHING}
        if etag_matches(if_none_match, state.vocab.etag):
            return Response(status_code=304, headers=headers)
        return Response(state.vocab.body, media_type="application/json", headers=headers)


def _install_step_routes(router: APIRouter, explainer: Explainer) -> None:
    @router.post("/explain/sessions/{key}/step")
    async def step(key: str, body: StepRequest):
        opened = explainer.session(key)
        session, params = opened.session, body.params()
        async with explainer.state(opened.served).lock:
            view = await anyio.to_thread.run_sync(
                lambda: session.step(params, body.node, body.token_id, body.top_n, body.use_cache))
        view["step"] = dataclasses.asdict(view["step"])
        path = session.path(view["child"])
        view["attention"] = [[_rounded(head) for head in layer] for layer in view["attention"]]
        view["attention_mean"] = [_rounded(layer) for layer in view["attention_mean"]]
        if view["experts"] is not None:
            view["experts"] = [{**r, "weights": _rounded(r["weights"]), "probs": _rounded(r["probs"])}
                               for r in view["experts"]]
        return {**view, "tree": session.tree(),
                "current": session.current,
                "generated": _chips(opened.served.tokenizer, path), "text": session.text(view["child"])}

    @router.post("/explain/sessions/{key}/redraw")
    async def redraw(key: str, body: RedrawRequest):
        opened = explainer.session(key)
        session, params = opened.session, body.params()
        async with explainer.state(opened.served).lock:
            view = await anyio.to_thread.run_sync(lambda: session.redraw(params, body.node, body.top_n))
        return {**view, "step": dataclasses.asdict(view["step"])}

    @router.post("/explain/sessions/{key}/goto")
    async def goto(key: str, body: GotoRequest):
        opened = explainer.session(key)
        session = opened.session
        session.goto(body.node)
        return {"tree": session.tree(), "current": session.current, "text": session.text(session.current),
                "generated": _chips(opened.served.tokenizer, session.path(session.current))}


def _vocabulary(served: ServedModel) -> Vocabulary:
    """The display text of every id the model can produce, as GET /explain/vocab's body."""
    size = served.model.config.vocab_size
    texts = [lesson.token_text(served.tokenizer, i) for i in range(size)]
    body = json.dumps({"model": served.name, "vocab_size": size, "texts": texts}, ensure_ascii=False,
                      separators=(",", ":")).encode()
    return Vocabulary(body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names etag (weak comparison, RFC 9110 §13.1.2):
    etag_matches('W/"a", "b"', '"b"') -> True; etag_matches('"a"', '"b"') -> False; "*" matches any."""
    if not if_none_match:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _rounded(weights: list[float]) -> list[float]:
    """Attention and router weights as the page shows them: 4 places (a tenth of the JSON a float takes)."""
    return [round(w, 4) for w in weights]


def _moe_facts(model) -> dict | None:
    """A mixture of experts' parameters per token, total vs active, for the page (None: dense)."""
    facts = expert_facts(model)
    return None if facts is None else round5(dataclasses.asdict(facts))


def _chips(tokenizer, ids: list[int]) -> list[dict]:
    return [{"id": p.id, "text": p.text, "bytes": p.bytes.hex(" ")} for p in tokenizer.pieces(ids)]
