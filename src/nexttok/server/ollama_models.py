"""Ollama's model routes over the models this server was started with: GET /api/tags, POST
/api/show, GET /api/ps, GET /api/version. The model management routes (pull, push, create, copy,
delete, blobs) answer 501: the models are the ones `nexttok serve` loaded.

A served model is listed as name:latest when its name has no tag (Ollama's names always carry
one), and found by either spelling."""

from __future__ import annotations

import datetime
import hashlib
from importlib import metadata
from pathlib import Path

from fastapi import APIRouter, Request

from nexttok.checkpoints.weights import weight_bytes
from nexttok.errors import InvalidParameter
from nexttok.models.block_quant import BlockEmbedding, BlockLinear
from nexttok.models.quant import Int4Linear, Int8Linear, Q8Embedding
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.ollama_options import OLLAMA_DEFAULTS
from nexttok.server.ollama_schemas import OllamaShowRequest
from nexttok.server.scoring import FIM_TOKENS

router = APIRouter()
NOT_AVAILABLE = {501: {"description": "model management is not available: the server runs the models it "
                                      "was started with"}}
MANAGEMENT = [("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"), ("POST", "/api/copy"),
              ("DELETE", "/api/delete"), ("POST", "/api/blobs/{digest}"), ("HEAD", "/api/blobs/{digest}")]
QUANTIZED = {Int4Linear: "INT4", Int8Linear: "INT8", Q8Embedding: "Q8_0"}
FOREVER = datetime.timedelta(microseconds=(2**63 - 1) // 1000)  # Ollama's expiry of a model kept loaded


def tag(name: str) -> str:
    """Ollama's spelling of a served name: tag("tiny") == "tiny:latest"; tag("a/b:q4") == "a/b:q4"."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def ollama_served(request: Request, name: str | None) -> ServedModel:
    """The served model a request names, as given or as name:latest; unknown: a 404 in Ollama's words."""
    models = request.app.state.models
    for served in models.values():
        if name in (served.name, tag(served.name)):
            return served
    raise APIError(404, f"model {name!r} not found; this server runs {', '.join(map(tag, models))} "
                   "(models are chosen when `nexttok serve` starts)", param="model", code="model_not_found")


@router.get("/api/version")
async def version():
    """nexttok's version (this is not Ollama; its API is the one docs/api.md describes)."""
    return {"version": metadata.version("nexttok")}


@router.get("/api/tags")
async def tags(request: Request):
    """The served models, in Ollama's list shape."""
    return {"models": [listing(served) for served in request.app.state.models.values()]}


@router.get("/api/ps")
async def running(request: Request):
    """The loaded models: every served one, kept loaded for as long as the server runs."""
    models = []
    for served in request.app.state.models.values():
        size = weight_bytes(served.model)
        on_gpu = next(served.model.parameters()).device.type != "cpu"
        models.append({**listing(served), "size": size, "size_vram": size if on_gpu else 0,
                       "expires_at": _iso(datetime.datetime.now(datetime.UTC) + FOREVER),
                       "context_length": served.context_length})
    return {"models": models}


@router.post("/api/show")
async def show(body: OllamaShowRequest, request: Request):
    """A model's details, architecture (model_info, GGUF's keys), chat template, the defaults a
    request gets (parameters) and capabilities. There is no Modelfile."""
    if not (body.model or body.name):
        raise InvalidParameter("model", "model is required")
    served = ollama_served(request, body.model or body.name)
    template = served.chat_template
    return {"details": details(served), "model_info": model_info(served),
            "template": template.source if template is not None else "", "parameters": parameters(served),
            "capabilities": capabilities(served), "modified_at": _iso(_modified(served))}


def _management(request: Request):
    raise APIError(501, f"{request.method} {request.url.path}: model management is not available yet; this "
                   "server runs the models `nexttok serve` was started with", code="not_implemented")


def _add_management_routes() -> None:
    for method, path in MANAGEMENT:
        router.add_api_route(path, _management, methods=[method], responses=NOT_AVAILABLE,
                             summary=f"{method} {path}: not available (501)")


_add_management_routes()


def listing(served: ServedModel) -> dict:
    """A model as /api/tags lists it."""
    return {"name": tag(served.name), "model": tag(served.name), "modified_at": _iso(_modified(served)),
            "size": _disk_size(served.path), "digest": _digest(served), "details": details(served)}


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
    """An identity for the checkpoint: the sha256 of its files' names, sizes and modification
    times (not of their bytes, which would take a second a GB on the first /api/tags)."""
    path = served.path
    files = [] if path is None or not path.exists() else [path] if path.is_file() else sorted(path.iterdir())
    listing = "".join(f"{f.name} {f.stat().st_size} {f.stat().st_mtime_ns}\n" for f in files if f.is_file())
    return hashlib.sha256(f"{served.name}\n{listing}".encode()).hexdigest()


def _modified(served: ServedModel) -> datetime.datetime:
    if served.path is not None and served.path.exists():
        return datetime.datetime.fromtimestamp(served.path.stat().st_mtime, datetime.UTC)
    return datetime.datetime.fromtimestamp(served.created, datetime.UTC)


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
