"""Ollama's native API (its docs/api.md), so that Ollama's clients work unchanged: POST /api/chat,
POST /api/generate, POST /api/embed, POST /api/embeddings here; the model routes (/api/tags,
/api/show, /api/ps, /api/version and the 501s of model management) in ollama_models.py.

Generation runs the OpenAI routes' path: chat_plan renders the messages and tools through the
model's chat template, the options become a GenerationPlan (ollama_options.py) and each request is
one Generation on the model's batch scheduler. The answer is Ollama's NDJSON or one object
(ollama_wire.py). Errors on every path under /api are Ollama's {"error": "..."} with its status
codes (400 a bad request, 404 an unknown model, 503 a full waiting line), the ErrorShape
registered here.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from nexttok.errors import InvalidParameter
from nexttok.generation.loop import prompt_ids_for
from nexttok.server.completions import GenerationPlan, chat_plan
from nexttok.server.embeddings import check_dimensions, embed, input_ids
from nexttok.server.engine import ServedModel
from nexttok.server.errors import ErrorShape
from nexttok.server.ollama_models import keep_alive_of, not_found, ollama_served
from nexttok.server.ollama_models import router as model_router
from nexttok.server.ollama_options import plan_of
from nexttok.server.ollama_schemas import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaError,
    OllamaGenerateRequest,
    OllamaMessage,
)
from nexttok.server.ollama_wire import OllamaWire, answer, created_at, nanoseconds
from nexttok.server.routing import NDJSON, streams
from nexttok.server.schemas import ChatRequest
from nexttok.server.scoring import fim_ids
from nexttok.server.streaming import Run

PREFIX = "/api"
LINES = streams(NDJSON, "one JSON object a line; the last one has done: true")


def ollama_error(status: int, message: str, param: str | None, code: str | None, kind: str) -> dict:
    """ollama_error(404, "model 'x' not found", "model", None, "invalid_request_error")
    -> {"error": "model 'x' not found"}."""
    return {"error": message}


# a full waiting line: Ollama answers 503 (its ErrMaxQueue, server/routes.go), not 429
OLLAMA_ERRORS = ErrorShape(ollama_error, OllamaError, statuses={429: 503}, full_location=True)

router = APIRouter()
router.include_router(model_router)


@router.post("/api/chat", responses=LINES)
async def chat(body: OllamaChatRequest, request: Request):
    arrived = time.perf_counter()
    if not body.messages and await _unloaded(request, body):
        return _loaded(body.model, {"message": {"role": "assistant", "content": ""}}, "unload")
    served = await ollama_served(request, body.model, body.keep_alive)
    _check_generating(served, body)
    if not body.messages:  # Ollama's way to load a model: it is loaded now
        return _loaded(body.model, {"message": {"role": "assistant", "content": ""}})
    if served.chat_template is None:  # chat_plan's own message points at /v1/completions
        raise InvalidParameter("messages", f"messages: {served.name!r} has no chat template; use /api/generate, "
                               "which takes the prompt as is")
    if body.tools and body.format:
        raise InvalidParameter("format", "format cannot be combined with tools (a tool call already follows "
                               "its tool's JSON schema)")
    messages = [_openai_message(i, m) for i, m in enumerate(body.messages)]
    ids, tool_plan, tools = chat_plan(served, ChatRequest(model=served.name, messages=messages,
                                                          tools=body.tools or None))
    plan = _plan(body, tool_plan.schema if tools else _schema(body.format))
    wire = OllamaWire(body.model, served.tokenizer, ids, chat=True, tools=bool(tools),
                      top_logprobs=_top_logprobs(body), arrived=arrived)
    return await _submit(served, ids, plan, wire, body.stream)


@router.post("/api/generate", responses=LINES)
async def generate(body: OllamaGenerateRequest, request: Request):
    arrived = time.perf_counter()
    if not body.prompt and not body.suffix and await _unloaded(request, body):
        return _loaded(body.model, {"response": ""}, "unload")
    served = await ollama_served(request, body.model, body.keep_alive)
    _check_generating(served, body)
    if body.images:
        raise InvalidParameter("images", "images: the models here read text only")
    for name in ("width", "height", "steps"):
        if getattr(body, name) is not None:
            raise InvalidParameter(name, f"{name}: image generation is not available here (text models only)")
    if body.template:
        raise InvalidParameter("template", "template: Go templates do not run here; the model's own chat "
                               "template does (or raw: true for none)")
    if body.raw and (body.system or body.context):
        raise InvalidParameter("raw", "raw mode does not support system or context")
    if not body.prompt and not body.suffix:  # Ollama's way to load a model: it is loaded now
        return _loaded(body.model, {"response": ""})
    ids, templated = _generate_ids(served, body)
    plan = _plan(body, _schema(body.format))
    wire = OllamaWire(body.model, served.tokenizer, ids, chat=False, top_logprobs=_top_logprobs(body),
                      context=templated, arrived=arrived)
    return await _submit(served, ids, plan, wire, body.stream)


@router.post("/api/embed")
async def embed_texts(body: OllamaEmbedRequest, request: Request):
    """Each input's vector, the /v1/embeddings route's own (mean-pooled, L2-normalised)."""
    arrived = time.perf_counter()
    served = await ollama_served(request, body.model, body.keep_alive)
    check_dimensions(served, body.dimensions)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if texts in ([], [""]):  # Ollama's answer to nothing to embed
        return {"model": body.model, "embeddings": []}
    inputs = input_ids(served, texts, truncate=body.truncate)
    vectors = await embed(request.app, served, inputs)
    return {"model": body.model, "embeddings": [v.tolist() for v in vectors],
            "total_duration": nanoseconds(time.perf_counter() - arrived), "load_duration": 0,
            "prompt_eval_count": sum(map(len, inputs))}


@router.post("/api/embeddings")
async def embedding(body: OllamaEmbeddingsRequest, request: Request):
    """The older route: one prompt, one vector (the same vector /api/embed gives)."""
    served = await ollama_served(request, body.model, body.keep_alive)
    if not body.prompt:
        return {"embedding": []}
    vectors = await embed(request.app, served, input_ids(served, body.prompt, truncate=True))
    return {"embedding": vectors[0].tolist()}


def _check_generating(served: ServedModel, body: OllamaChatRequest | OllamaGenerateRequest) -> None:
    """What neither route can do here, refused by name."""
    if body.think is True or isinstance(body.think, str):
        raise InvalidParameter("think", f"think: {served.name!r} does not support thinking (no model here has a "
                               "thinking mode); send false or leave it out")
    if body.truncate:
        raise InvalidParameter("truncate", "truncate: nexttok never drops part of a prompt (one longer than the "
                               "context window is refused); send false or leave it out")
    if body.shift:
        raise InvalidParameter("shift", "shift: there is no context shift here (the output ends at the context "
                               "window with done_reason length); send false or leave it out")


def _openai_message(index: int, message: OllamaMessage) -> dict:
    """An Ollama message as the chat template takes it (OpenAI's shape, arguments as an object)."""
    if message.images:
        raise InvalidParameter("messages", f"messages[{index}].images: the models here read text only")
    converted = {"role": message.role.lower(), "content": message.content or ""}
    if message.thinking is not None:
        converted["thinking"] = message.thinking
    if message.tool_calls:
        converted["tool_calls"] = [{"id": call.id or f"call_{index}_{k}", "type": "function",
                                    "function": {"name": call.function.name, "arguments": call.function.arguments}}
                                   for k, call in enumerate(message.tool_calls)]
    if message.tool_name is not None:
        converted["name"] = message.tool_name
    if message.tool_call_id is not None:
        converted["tool_call_id"] = message.tool_call_id
    return converted


def _generate_ids(served: ServedModel, body: OllamaGenerateRequest) -> tuple[list[int], bool]:
    """(prompt ids, whether the chat template made them): fill-in-the-middle with a suffix; the
    prompt as is when raw (or the model has no chat template); else system + prompt as messages,
    after the ids of an earlier reply's `context`."""
    if body.suffix:
        extra = next((name for name in ("system", "context") if getattr(body, name)), None)
        if extra is not None:  # the infill prompt has no place for them: refused, not dropped
            raise InvalidParameter(extra, f"{extra} cannot be combined with suffix (fill-in-the-middle takes the "
                                   "prompt and suffix alone)")
        return fim_ids(served.tokenizer, body.prompt or "", body.suffix), False
    if body.raw or served.chat_template is None:
        if body.system:
            raise InvalidParameter("system", f"system: {served.name!r} has no chat template to put it in")
        return prompt_ids_for(served.model, served.tokenizer, body.prompt, served.context_length), False
    vocab = served.model.config.vocab_size
    outside = [i for i in body.context or () if i >= vocab]
    if outside:  # not an id a reply of this model returned
        raise InvalidParameter("context", f"context: token id {outside[0]} is outside the vocabulary of "
                               f"{served.name!r} (0..{vocab - 1})")
    messages = [{"role": "system", "content": body.system}] if body.system else []
    ids, _, _ = chat_plan(served, ChatRequest(model=served.name, messages=[*messages,
                                                                           {"role": "user", "content": body.prompt}]))
    return [*(body.context or []), *ids], True


def _plan(body: OllamaChatRequest | OllamaGenerateRequest, schema: dict | None) -> GenerationPlan:
    top = _top_logprobs(body)
    return plan_of(body.options, top_n=top or 0, logprobs=top is not None, schema=schema)


def _top_logprobs(body: OllamaChatRequest | OllamaGenerateRequest) -> int | None:
    """Alternatives per token when logprobs are asked for (top_logprobs alone does nothing, as in Ollama)."""
    return (body.top_logprobs or 0) if body.logprobs else None


def _schema(output_format) -> dict | None:
    """format as the JSON schema the grammar stage follows: "json" = any object; "" = free text."""
    if not output_format:
        return None
    return {"type": "object"} if output_format == "json" else output_format


async def _submit(served: ServedModel, ids: list[int], plan: GenerationPlan, wire: OllamaWire, stream: bool):
    context = plan.context(served)
    if len(ids) >= context:
        raise InvalidParameter("options", f"the prompt is {len(ids)} tokens; the context window is {context} "
                               "(options.num_ctx, capped by the server's): it must leave room for one new token",
                               "context_length_exceeded")
    run = Run(ids, 0, served.scheduler.submit(plan.generation(served, ids, 0)))
    return await answer(run, wire, stream=stream)


async def _unloaded(request: Request, body: OllamaChatRequest | OllamaGenerateRequest) -> bool:
    """keep_alive 0 with nothing to generate: Ollama's way to unload a model, now (a model the
    server was started with stays). False for any other keep_alive."""
    if keep_alive_of(request, body.keep_alive) != 0:
        return False
    pool = request.app.state.pool
    served = pool.find(body.model)
    if served is None and pool.loadable(body.model) is None:
        raise not_found(request, body.model)
    if served is not None:
        await pool.unload(served.name)
    return True


def _loaded(model: str, text: dict, reason: str = "load") -> JSONResponse:
    return JSONResponse({"model": model, "created_at": created_at(), **text, "done": True, "done_reason": reason})

