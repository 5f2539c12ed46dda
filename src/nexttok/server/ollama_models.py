"""Ollama's model routes: GET /api/tags (the models the server started with, and the stored ones it
loads on first use), POST /api/show, GET /api/ps (the loaded ones, with when each unloads),
GET /api/version, POST /api/pull (a hub model into the store, progress as NDJSON), DELETE
/api/delete and POST /api/copy (the store's names). push, create and the blob routes answer 501:
models come from the hub here, not from Modelfiles.

A served model is listed as name:latest when its name has no tag (Ollama's names always carry
one), and found by either spelling; a stored one by any of its spellings (store.py)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import re
from importlib import metadata
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from nexttok.checkpoints.weights import weight_bytes
from nexttok.errors import InvalidParameter
from nexttok.models.block_quant import BlockEmbedding, BlockLinear
from nexttok.models.quant import Int4Linear, Int8Linear, Q8Embedding
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.ollama_options import OLLAMA_DEFAULTS
from nexttok.server.ollama_schemas import (
    OllamaCopyRequest,
    OllamaDeleteRequest,
    OllamaError,
    OllamaPullRequest,
    OllamaShowRequest,
)
from nexttok.server.pool import keep_alive_seconds
from nexttok.server.routing import NDJSON, streams
from nexttok.server.scoring import FIM_TOKENS
from nexttok.server.streaming import NDJSON_LINES, stream_response

router = APIRouter()
NOT_AVAILABLE = {501: {"description": "not available: models come from the Hugging Face hub here (/api/pull), "
                                      "not from Modelfiles or uploaded blobs"}}
MANAGEMENT = [("POST", "/api/push"), ("POST", "/api/create"), ("POST", "/api/blobs/{digest}"),
              ("HEAD", "/api/blobs/{digest}")]
PROGRESS_EVERY = 0.1  # seconds between two progress lines of one download
QUANTIZED = {Int4Linear: "INT4", Int8Linear: "INT8", Q8Embedding: "Q8_0"}
FOREVER = datetime.timedelta(microseconds=(2**63 - 1) // 1000)  # Ollama's expiry of a model kept loaded


def tag(name: str) -> str:
    """Ollama's spelling of a served name: tag("tiny") == "tiny:latest"; tag("a/b:q4") == "a/b:q4"."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def keep_alive_of(request: Request, value) -> float | None:
    """A request's keep_alive in seconds (None: forever), the server's default when absent."""
    try:
        return keep_alive_seconds(value, request.app.state.pool.keep_alive)
    except ValueError as e:
        raise InvalidParameter("keep_alive", str(e)) from None


async def ollama_served(request: Request, name: str | None, keep_alive=None) -> ServedModel:
    """The model a request names, as given or as name:latest, loaded first if it is a stored one
    not loaded yet; it stays keep_alive once idle. Unknown: a 404 in Ollama's words."""
    pool = request.app.state.pool
    if pool.find(name) is None and (name is None or pool.loadable(name) is None):
        raise not_found(request, name)
    return await pool.get(name, keep_alive_of(request, keep_alive))


def not_found(request: Request, name: str | None) -> APIError:
    models = request.app.state.pool.models
    return APIError(404, f"model {name!r} not found; this server runs {', '.join(map(tag, models)) or 'none'} "
                    "and loads the models `nexttok pull` stored (`nexttok list`, /api/tags)", param="model",
                    code="model_not_found")


@router.get("/api/version")
async def version():
    """nexttok's version (this is not Ollama; its API is the one docs/api.md describes), and the
    engine's name, by which `nexttok run` knows a nexttok server from an Ollama on the same port."""
    return {"version": metadata.version("nexttok"), "engine": "nexttok"}


@router.get("/api/tags")
async def tags(request: Request):
    """The models this server runs or loads on first use, in Ollama's list shape: the loaded ones,
    then the stored ones (the newest first)."""
    pool = request.app.state.pool
    return {"models": [*(listing(served) for served in pool.models.values()),
                       *(stored_listing(manifest) for manifest in pool.stored())]}


@router.get("/api/ps")
async def running(request: Request):
    """The loaded models, each with when it unloads if nothing more comes (a model the server was
    started with, or kept with a negative keep_alive: in some 292 years, as Ollama says forever)."""
    pool, models = request.app.state.pool, []
    for served in list(pool.models.values()):
        size = weight_bytes(served.model)
        on_gpu = next(served.model.parameters()).device.type != "cpu"
        expires = pool.expires_at(served.name) if served.name in pool.entries else None
        moment = expires if expires is not None else datetime.datetime.now(datetime.UTC) + FOREVER
        models.append({**listing(served), "size": size, "size_vram": size if on_gpu else 0,
                       "expires_at": _iso(moment), "context_length": served.context_length})
    return {"models": models}


PULL_ANSWERS = streams(
    NDJSON, "one JSON object a line: pulling manifest, pulling <digest> (total, completed), verifying sha256 "
            "digest, writing manifest, success; or error, last",
    {200: {"description": "progress; stream false: {\"status\": \"success\"} once the model is stored"},
     404: {"description": "the hub has no such repo, or no GGUF file for the tag", "model": OllamaError},
     502: {"description": "the hub could not be reached, or the download failed", "model": OllamaError}})


@router.post("/api/pull", responses=PULL_ANSWERS)
async def pull(body: OllamaPullRequest, request: Request):
    """A hub model into the store (hub_pull.py), its progress as Ollama's NDJSON: pulling manifest,
    pulling <digest> with total and completed bytes, verifying sha256 digest, writing manifest,
    success; an error is the last line ({"error": ...}). stream false: one object at the end."""
    from nexttok.checkpoints.store import ModelName

    name = body.model or body.name
    if not name:
        raise InvalidParameter("model", "model is required")
    try:
        parsed = ModelName.parse(name)
    except ValueError as e:
        raise InvalidParameter("model", str(e)) from None
    if not parsed.host:
        raise InvalidParameter("model", f"{name!r} names no hub repository: pull hf.co/ORG/REPO[:QUANT] or "
                               "ORG/REPO[:QUANT]")
    events = _pull_events(name)
    if body.stream:  # its errors are events already, each with its status (not the stream's)
        return stream_response(NDJSON_LINES, _without_status(events), [], lambda e: {"error": str(e)}, errors=())
    last = {}
    async for last in events:
        if "error" in last:  # 404: nothing on the hub by that name; 502: the hub or the download failed
            return JSONResponse({"error": last["error"]}, status_code=last["http_status"])
    return last


@router.delete("/api/delete")
async def delete(body: OllamaDeleteRequest, request: Request):
    """A stored name goes (and its file when no other name uses it); loaded, it is unloaded first."""
    from nexttok.checkpoints import store

    name = body.model or body.name
    if not name:
        raise InvalidParameter("model", "model is required")
    pool = request.app.state.pool
    manifest = store.find(name) if store.parse_or_none(name) is not None else None
    if manifest is None:
        raise APIError(404, f"model {name!r} not found", param="model", code="model_not_found")
    await pool.unload(manifest.name)
    await asyncio.to_thread(store.remove, manifest.name)
    return Response(status_code=200)


@router.post("/api/copy")
async def copy(body: OllamaCopyRequest):
    """The same stored file under another name too."""
    from nexttok.checkpoints import store

    if store.parse_or_none(body.source) is None or store.find(body.source) is None:
        raise APIError(404, f"model {body.source!r} not found", param="source", code="model_not_found")
    try:
        await asyncio.to_thread(store.copy, body.source, body.destination)
    except ValueError as e:
        raise InvalidParameter("destination", str(e)) from None
    return Response(status_code=200)


async def _pull_events(name: str):
    """hub_pull.pull in a thread, its progress as Ollama's event objects (a download's at most
    every PROGRESS_EVERY seconds, and its last), then success or an error."""
    from nexttok.checkpoints.hub_pull import NothingToPull
    from nexttok.checkpoints.hub_pull import pull as hub_pull

    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    last = {"at": 0.0}

    def report(step) -> None:
        if step.total is not None and step.completed not in (0, step.total):
            now = loop.time()
            if now - last["at"] < PROGRESS_EVERY:
                return
            last["at"] = now
        event = {"status": step.status}
        if step.digest is not None:
            event.update(digest=step.digest, total=step.total, completed=step.completed)
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def run() -> None:
        try:
            hub_pull(name, report)
        except (OSError, ValueError) as e:
            status = 404 if isinstance(e, NothingToPull) else 502
            loop.call_soon_threadsafe(queue.put_nowait, {"error": str(e), "http_status": status})
        loop.call_soon_threadsafe(queue.put_nowait, None)

    worker = loop.run_in_executor(None, run)
    while (event := await queue.get()) is not None:
        yield event
    await worker


async def _without_status(events):
    async for event in events:
        event.pop("http_status", None)  # an error's: the stream's status is 200 already
        yield event


@router.post("/api/show")
async def show(body: OllamaShowRequest, request: Request):
    """A model's details, architecture (model_info, GGUF's keys), chat template, the defaults a
    request gets (parameters) and capabilities. There is no Modelfile."""
    if not (body.model or body.name):
        raise InvalidParameter("model", "model is required")
    served = await ollama_served(request, body.model or body.name)
    template = served.chat_template
    return {"details": details(served), "model_info": model_info(served),
            "template": template.source if template is not None else "", "parameters": parameters(served),
            "capabilities": capabilities(served), "modified_at": _iso(_modified(served))}


def _management(request: Request):
    raise APIError(501, f"{request.method} {request.url.path}: not available here; models come from the Hugging "
                   "Face hub (POST /api/pull, `nexttok pull`), not from Modelfiles or uploaded blobs",
                   code="not_implemented")


def _add_management_routes() -> None:
    for method, path in MANAGEMENT:
        router.add_api_route(path, _management, methods=[method], responses=NOT_AVAILABLE,
                             summary=f"{method} {path}: not available (501)")


_add_management_routes()


def listing(served: ServedModel) -> dict:
    """A model as /api/tags lists it."""
    return {"name": tag(served.name), "model": tag(served.name), "modified_at": _iso(_modified(served)),
            "size": _disk_size(served.path), "digest": _digest(served), "details": details(served)}


def stored_listing(manifest) -> dict:
    """A stored model, not loaded, as /api/tags lists it (its details from the GGUF's header)."""
    found = manifest.details
    family = found.get("family", "")
    count = found.get("parameter_count")
    return {"name": manifest.name, "model": manifest.name, "modified_at": _iso(manifest.modified),
            "size": manifest.size, "digest": manifest.sha256,
            "details": {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else [],
                        "parameter_size": human_count(count) if count else "",
                        "quantization_level": found.get("quantization_level", "")}}


def details(served: ServedModel) -> dict:
    family = served.model.config.model_type
    gguf = served.path is not None and served.path.suffix == ".gguf"
    return {"parent_model": "", "format": "gguf" if gguf else "safetensors", "family": family,
            "families": [family], "parameter_size": human_count(parameter_count(served.model)),
            "quantization_level": quantization_level(served.model)}


def model_info(served: ServedModel) -> dict:
    """The architecture under GGUF's key names, as Ollama's show gives them."""
    config, arch = served.model.config, served.model.config.model_type
    info = {"general.architecture": arch, "general.parameter_count": parameter_count(served.model),
            f"{arch}.context_length": config.max_position_embeddings, f"{arch}.embedding_length": config.hidden_size,
            f"{arch}.block_count": config.num_hidden_layers, f"{arch}.feed_forward_length": config.intermediate_size,
            f"{arch}.attention.head_count": config.num_attention_heads,
            f"{arch}.attention.head_count_kv": config.num_key_value_heads,
            f"{arch}.attention.key_length": config.head_dim, f"{arch}.rope.freq_base": config.rope_theta,
            f"{arch}.attention.layer_norm_rms_epsilon": config.norm_eps, f"{arch}.vocab_size": config.vocab_size}
    if config.num_experts:
        info[f"{arch}.expert_count"] = config.num_experts
        info[f"{arch}.expert_used_count"] = config.num_experts_per_tok
    if config.bos_token_id is not None:
        info["tokenizer.ggml.bos_token_id"] = config.bos_token_id
    if config.eos_token_id:
        info["tokenizer.ggml.eos_token_id"] = config.eos_token_id[0]
    return info


def parameters(served: ServedModel) -> str:
    """The defaults a request gets, in Ollama's `name value` lines."""
    lines = [f"{name:<30} {value:g}" for name, value in OLLAMA_DEFAULTS.items()]
    lines.append(f"{'num_ctx':<30} {served.context_length}")
    stops = [served.tokenizer.decode([i]) for i in served.model.config.eos_token_id]
    lines += [f'{"stop":<30} "{text}"' for text in stops if text]
    return "\n".join(lines)


def capabilities(served: ServedModel) -> list[str]:
    """completion always; tools with a chat template (any chat model calls tools here: tools.py);
    insert with fill-in-the-middle tokens; embedding (mean pooling, /api/embed)."""
    found = ["completion"]
    if served.chat_template is not None:
        found.append("tools")
    tokenizer = served.tokenizer
    if any(all(tokenizer.token_to_id(name) is not None for name in names) for names in FIM_TOKENS):
        found.append("insert")
    return [*found, "embedding"]


def parameter_count(model) -> int:
    """Weights of a model, quantized ones counted as the values they stand for: a float tensor
    counts its elements; a quantized layer (no float weight) in × out, a quantized table rows × width."""
    total, seen = 0, set()
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        total += sum(p.numel() for p in own if id(p) not in seen)  # a tied weight once
        seen |= {id(p) for p in own}
        if any(p.dim() > 1 for p in own):
            continue
        if hasattr(module, "in_features") and hasattr(module, "out_features"):
            total += module.in_features * module.out_features
        elif hasattr(module, "num_embeddings") and hasattr(module, "embedding_dim"):
            total += module.num_embeddings * module.embedding_dim
    return total


def human_count(n: int) -> str:
    """As Ollama writes a parameter count: human_count(134_515_008) == "134.52M"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + unit
    return str(n)


def quantization_level(model) -> str:
    """The type most layers' weights are kept in: a GGUF block type (Q4_K ...), INT4 or INT8
    (`--dtype int4/int8`), or the float dtype (F32, BF16, F16)."""
    kinds: dict[str, int] = {}
    for module in model.modules():
        for kind in _kinds_of(module):
            kinds[kind] = kinds.get(kind, 0) + 1
    if kinds:
        return max(kinds, key=kinds.get)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}.get(dtype, dtype.upper())


def _kinds_of(module) -> list[str]:
    """The storage types of one layer's weights ([] for a float layer)."""
    for cls, kind in QUANTIZED.items():
        if isinstance(module, cls):
            return [kind]
    if isinstance(module, BlockLinear):
        return list(module.kinds)
    return [module.kind] if isinstance(module, BlockEmbedding) else []


def _disk_size(path: Path | None) -> int:
    """Bytes of the checkpoint's files (a .gguf file, or the folder's files)."""
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _digest(served: ServedModel) -> str:
    """An identity for the checkpoint: a stored file's own sha256 (its name says it), else the
    sha256 of its files' names, sizes and modification times (not of their bytes, which would take
    a second a GB on the first /api/tags)."""
    path = served.path
    stored = re.fullmatch(r"sha256-([0-9a-f]{64})\.gguf", path.name) if path is not None else None
    if stored is not None:
        return stored.group(1)
    files = [] if path is None or not path.exists() else [path] if path.is_file() else sorted(path.iterdir())
    listing = "".join(f"{f.name} {f.stat().st_size} {f.stat().st_mtime_ns}\n" for f in files if f.is_file())
    return hashlib.sha256(f"{served.name}\n{listing}".encode()).hexdigest()


def _modified(served: ServedModel) -> datetime.datetime:
    if served.path is not None and served.path.exists():
        return datetime.datetime.fromtimestamp(served.path.stat().st_mtime, datetime.UTC)
    return datetime.datetime.fromtimestamp(served.created, datetime.UTC)


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
