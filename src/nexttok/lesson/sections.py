"""The lesson's computations: what the explainer's sections show beyond one step of generation.

Every number comes from the served model itself: the embedding matrix it was trained with, its own
position table or RoPE frequencies, its attention weights and residual stream (one forward pass
with a full AttentionCapture), its final norm and lm_head for the logit lens. The page, the CLI and
the tests all call these functions; nothing here samples (that stays in sampling.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nexttok.errors import InvalidParameter
from nexttok.models import Model
from nexttok.models.attention import AttentionCapture
from nexttok.tokenizers.tokenizer import Tokenizer

INSPECT_MAX = 256  # tokens one inspection covers: its T x T weights per layer and head stay small
EMBEDDING_CHUNK = 8192  # vocabulary rows read at a time when comparing a vector with all of them


@dataclass
class Inspection:
    """One forward pass over a whole sequence with everything recorded (no KV cache involved)."""

    ids: list[int]
    hidden: list[torch.Tensor]  # L + 1 residual streams (T, hidden): after the embeddings, after each layer
    # per attention entry, A of them (one per attention layer: a recurrent layer attends to nothing)
    weights: torch.Tensor  # (A, n_head, T, T) attention weights, float32
    # per entry, as its heads are sized (Gemma 4's full layers have larger ones):
    q: list[torch.Tensor]  # (n_head, T, head_dim) queries after RoPE, float32
    k: list[torch.Tensor]  # (n_head, T, head_dim) keys (shared heads repeated), float32
    v: list[torch.Tensor]  # (n_head, T, head_dim) values, float32
    logits: torch.Tensor  # (T, vocab) the model's output, float32
    windows: list[int | None]  # per entry: how many recent keys a query sees (None: all earlier ones)
    layers: list[int]  # per entry: the model's layer it belongs to (AttentionCapture.layers)
    layer_types: list[str]  # per layer of the model: config.layer_types

    def entry(self, layer: int) -> int:
        """The attention entry of model layer `layer` (a clear error for a layer out of range, or a
        recurrent one: it has no attention weights)."""
        if not 0 <= layer < len(self.layer_types):
            raise InvalidParameter("layer", f"layer must be in 0..{len(self.layer_types) - 1}")
        if layer not in self.layers:
            raise InvalidParameter("layer", f"layer {layer} is a recurrent layer ({self.layer_types[layer]}): it keeps "
                                   "a state of fixed size instead of keys, so it has no attention weights")
        return self.layers.index(layer)


def inspect(model: Model, ids: list[int]) -> Inspection:
    """Run ids through the model once, capturing the residual stream of every layer, and q/k/v and
    attention weights of every attention layer. inspect(model, [1, 2, 3]).weights.shape == (layers, heads, 3, 3)
    for a model of attention layers only."""
    if not 0 < len(ids) <= INSPECT_MAX:
        raise InvalidParameter("node", f"an inspection covers 1 to {INSPECT_MAX} tokens, this path has {len(ids)}")
    device = next(model.parameters()).device
    capture = AttentionCapture(full=True)
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=device), None, capture=capture)[0].float()  # (T, vocab)
    per_entry = [[layer[i][0] for layer in capture.qkv] for i in range(3)]  # q, k, v: A of (n_head, T, hd)
    kinds = list(model.config.layer_types)
    windows = [model.config.sliding_window if kinds[layer] == "sliding_attention" else None
               for layer in capture.layers]
    return Inspection(list(ids), [h[0] for h in capture.hidden], torch.stack([w[0] for w in capture.weights]),
                      *per_entry, logits, windows, list(capture.layers), kinds)


def lens(model: Model, tokenizer: Tokenizer, inspection: Inspection, position: int = -1, top: int = 5) -> dict:
    """The logit lens: what each layer would predict at `position` if the model stopped there (the
    final norm and lm_head applied to that layer's residual stream). Layer 0 is the embeddings;
    the last layer's row is the model's own prediction. `final` follows the model's final token up
    through the layers: its probability and rank at each."""
    position = _position(inspection, position)
    stream = torch.stack([h[position] for h in inspection.hidden])  # (L + 1, hidden)
    with torch.inference_mode():
        probs = model.head(stream).float().softmax(-1)  # (L + 1, vocab)
    final = int(probs[-1].argmax())
    layers = []
    for layer, row in enumerate(probs):
        best = torch.topk(row, min(top, row.shape[-1]))
        layers.append({
            "layer": layer,
            "top": [{"id": i, "text": token_text(tokenizer, i), "p": float(p)}
                    for i, p in zip(best.indices.tolist(), best.values.tolist(), strict=True)],
            "final_p": float(row[final]), "final_rank": int((row > row[final]).sum()) + 1,
        })
    return {"position": position, "final": {"id": final, "text": token_text(tokenizer, final)}, "layers": layers}


def attention_matrix(inspection: Inspection, layer: int, head: int | None) -> torch.Tensor:
    """The T x T attention weights of one layer (the model's layer index) and head (row = query,
    column = key), or the mean over the layer's heads when head is None."""
    weights = inspection.weights[_check_layer_head(inspection, layer, head)]  # (n_head, T, T)
    return weights.mean(0) if head is None else weights[head]


def attention_detail(inspection: Inspection, layer: int, head: int, query: int) -> dict:
    """One query of one head worked through by hand: q, the keys it may see (positions first..query:
    no later key, and no older one than the layer's sliding window), the scores q·k/√d, their softmax
    (equal to the model's weights) and the output, the weighted sum of the values."""
    entry = _check_layer_head(inspection, layer, head)
    query = _position(inspection, query, "query")
    window = inspection.windows[entry]
    first = max(0, query - window + 1) if window else 0
    q = inspection.q[entry][head, query]  # (hd,)
    keys = inspection.k[entry][head, first : query + 1]  # (query + 1 - first, hd)
    values = inspection.v[entry][head, first : query + 1]
    scale = math.sqrt(q.shape[-1])
    scores = keys @ q / scale  # (query + 1 - first,)
    weights = scores.softmax(-1)
    return {"layer": layer, "head": head, "query": query, "first": first, "head_dim": q.shape[-1], "scale": scale,
            "q": q, "keys": keys, "values": values, "scores": scores, "weights": weights,
            "model_weights": inspection.weights[entry, head, query, first : query + 1], "output": weights @ values}


def word_ids(tokenizer: Tokenizer, word: str) -> list[int]:
    """The tokens of a word as it appears inside a sentence (after a space); special tokens stay text.
    word_ids(gpt2, "king") == [5822]  (" king")"""
    return tokenizer.encode(" " + word_ids_check(word), allow_special=False)


def word_ids_check(word: str) -> str:
    """The word without surrounding spaces, or a clear error when it is empty or too long."""
    word = word.strip()
    if not word or len(word) > 64:
        raise InvalidParameter("word", f"a word must be 1 to 64 characters (not only spaces), got {word[:80]!r}")
    return word


def embedding_rows(model: Model, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """Rows of the model's token embedding matrix as float32 (n, hidden)."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        return model.embed(torch.as_tensor(ids, device=device)[None])[0].float()


def word_vector(model: Model, tokenizer: Tokenizer, word: str) -> tuple[list[int], torch.Tensor]:
    """A word's ids and its vector: its embedding row, or the mean of its pieces' rows."""
    ids = word_ids(tokenizer, word)
    return ids, embedding_rows(model, ids).mean(0)


def neighbors(model: Model, vector: torch.Tensor, k: int, exclude: list[int] = ()) -> list[tuple[int, float]]:
    """The k vocabulary entries whose embedding rows are nearest `vector` by cosine similarity
    (ids in `exclude` left out), best first: [(id, cosine), ...]."""
    vocab = model.config.vocab_size
    target = F.normalize(vector.float(), dim=-1)
    similarity = torch.empty(vocab)
    for start in range(0, vocab, EMBEDDING_CHUNK):
        rows = embedding_rows(model, torch.arange(start, min(start + EMBEDDING_CHUNK, vocab)))
        similarity[start : start + rows.shape[0]] = (F.normalize(rows, dim=-1) @ target).cpu()
    similarity[list(exclude)] = -math.inf
    best = torch.topk(similarity, min(k, vocab - len(set(exclude))))
    return list(zip(best.indices.tolist(), best.values.tolist(), strict=True))


def pca_map(vectors: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """2-D coordinates of n vectors (n, hidden) on their first two principal components, and the
    share of the variance each component explains. The sign of a component is fixed so that its
    largest coordinate is positive (an SVD may return either)."""
    centered = vectors.float() - vectors.float().mean(0)
    u, s, _ = torch.linalg.svd(centered, full_matrices=False)
    coords = u[:, :2] * s[:2]  # (n, 2)
    flip = torch.where(coords.gather(0, coords.abs().argmax(0, keepdim=True)) < 0, -1.0, 1.0)
    variance = s.pow(2)
    share = (variance[:2] / variance.sum()).tolist() if float(variance.sum()) > 0 else [0.0, 0.0]
    return coords * flip, share


def cosine_matrix(vectors: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarity (n, n) of n vectors."""
    unit = F.normalize(vectors.float(), dim=-1)
    return unit @ unit.T


def positions(model: Model, count: int, distance: int) -> dict:
    """How the model tells positions apart. Learned (GPT-2): the cosine similarity of the first
    `count` rows of its position table. RoPE (Llama family): the angle each dimension pair turns
    at each of the first `count` positions (radians, mod 2π), and the score q·k of a query and a key
    that are the same all-ones vector rotated `d` positions apart, for d = 0..distance, as a share
    of the unrotated score: how RoPE alone makes attention depend on distance."""
    config = model.config
    if model.POSITIONS == "learned":
        count = min(count, config.max_position_embeddings)
        return {"kind": "learned", "similarity": cosine_matrix(model.position_table()[:count].detach())}
    frequencies = model.inverse_frequencies().double()  # (rotated dims / 2,) radians per position
    steps = torch.arange(count, dtype=torch.float64)
    angles = torch.remainder(steps[:, None] * frequencies[None], 2 * math.pi)  # (count, hd/2)
    d = torch.arange(distance + 1, dtype=torch.float64)
    score = torch.cos(d[:, None] * frequencies[None]).mean(-1)  # (distance + 1,)
    return {"kind": "rope", "frequencies": frequencies, "angles": angles, "score": score}


def kv_cache_bytes_per_token(model: Model, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token adds to a cache that keeps every key: 2 x kv heads x
    head_dim x size, summed over the layers that store keys (each with its own shape: Gemma 4's
    differ; a recurrent layer keeps none: lesson.layers)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    shapes = model.config.cache_shapes()
    return 2 * sum(shapes[i][0] * shapes[i][1] for i in model.config.attention_layers if shapes[i]) * itemsize


def stop_probability(model: Model, logits: torch.Tensor, stop_ids: list[int]) -> float:
    """The probability the model gives to ending here: the sum over its stop (EOS) tokens."""
    ids = [i for i in stop_ids if 0 <= i < model.config.vocab_size]
    return float(logits.float().softmax(-1)[ids].sum()) if ids else 0.0


def cost(tokens: int, price_per_million: float) -> float:
    """What tokens cost at a price per million: cost(1500, 2.0) == 0.003."""
    return tokens * price_per_million / 1e6


def _position(inspection: Inspection, position: int, name: str = "position") -> int:
    t = len(inspection.ids)
    if not -t <= position < t:
        raise InvalidParameter(name, f"{name} must be in 0..{t - 1} (or -1 for the last)")
    return position % t


def _check_layer_head(inspection: Inspection, layer: int, head: int | None) -> int:
    """The attention entry of model layer `layer`, once layer and head are checked."""
    entry = inspection.entry(layer)
    heads = inspection.weights.shape[1]
    if head is not None and not 0 <= head < heads:
        raise InvalidParameter("head", f"head must be in 0..{heads - 1} (or null for the mean of the heads)")
    return entry


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's display text; an id the tokenizer lacks shows as <id>."""
    try:
        return tokenizer.pieces([token_id])[0].text
    except ValueError:  # an id the model has but the tokenizer does not (padding rows)
        return f"<{token_id}>"
