"""The lesson's routes: the explainer page's sections beyond one step, each a JSON view.

On a session (the path to a node of its tree; node defaults to the current one):
POST /explain/sessions/{id}/lens              {node?, position?, top_n?}  -> each layer's top tokens
POST /explain/sessions/{id}/attention         {node?, layer, head?}  -> the layer's kind and window, and
                                              the T x T weights (head null: mean); a recurrent layer:
                                              no weights, its state (lesson.layers.LayerKind)
POST /explain/sessions/{id}/attention/detail  {node?, layer, head, query}  -> q, k, scores, softmax, v, output
(layer: the model's layer index, 0..num_hidden_layers - 1)
On a model:
POST /explain/tokens       {text, price_input?, price_output?, output_tokens?} -> pieces, count, cost
POST /explain/embeddings   {word, k?}  -> the word's vector and its nearest neighbours by cosine
POST /explain/embeddings/map  {words}  -> a 2-D PCA map of the words and their pairwise cosines
POST /explain/positions    {count?, distance?}  -> learned position similarity or RoPE angles and decay
POST /explain/experiments/repeat  {prompt, max_tokens?, seed?}  -> 2 runs at temperature 0, 2 at 1, each
                                  a trace, and each pair's diff view (traces.py)
POST /explain/experiments/length  {prompt, lengths?, price_input?, price_output?}  -> time and cost per length
POST /explain/experiments/speculative  {prompt, max_tokens?, draft_tokens?, temperature?, seed?}
                                  -> each token's draft (none, accepted, refused: the proposal and the
                                     distribution it was refused by), the acceptance, tokens per forward

The session views share one capture forward per node (ExplainSession.inspect), made only when
asked. Numbers are rounded to 5 significant digits for the page.
"""

from __future__ import annotations

import math
from typing import Annotated

import anyio
import torch
from fastapi import APIRouter
from pydantic import Field

from nexttok.generation.diff import diff_traces
from nexttok.generation.loop import generate, prompt_ids_for
from nexttok.generation.parameters import DRAFT_TOKENS_BOUND
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.speculative import DRAFT_TOKENS, NgramDrafter, Refusal, Rounds, speculative_stream
from nexttok.lesson import sections as lesson
from nexttok.server.lesson.traces import diff_view, install_traces, lesson_trace, trace_lines
from nexttok.server.schemas import Strict, bounded
from nexttok.server.traces import served_sha256

Price = Annotated[float, Field(ge=0, le=1000, description="US dollars per million tokens")]
Word = Annotated[str, Field(min_length=1, max_length=64)]
SPECULATIVE_ROWS = 10  # rows of the model's distribution shown where a draft was refused


class ModelRequest(Strict):
    model: str | None = None


class NodeRequest(Strict):
    node: int | None = Field(None, ge=0, description="a node of the session's tree (default: the current one)")


class LensRequest(NodeRequest):
    position: int = Field(-1, ge=-lesson.INSPECT_MAX, lt=lesson.INSPECT_MAX)
    top_n: int = Field(5, ge=1, le=20)


class AttentionRequest(NodeRequest):
    layer: int = Field(ge=0)
    head: int | None = Field(None, ge=0, description="null: the mean over the layer's heads")


class DetailRequest(NodeRequest):
    layer: int = Field(ge=0)
    head: int = Field(ge=0)
    query: int = Field(-1, ge=-lesson.INSPECT_MAX, lt=lesson.INSPECT_MAX)


class TokensRequest(ModelRequest):
    text: str = Field(max_length=100_000)
    price_input: Price = 0.15
    price_output: Price = 0.60
    output_tokens: int = Field(0, ge=0, le=10_000_000)


class EmbeddingRequest(ModelRequest):
    word: Word
    k: int = Field(10, ge=1, le=50)


class MapRequest(ModelRequest):
    words: Annotated[list[Word], Field(min_length=3, max_length=40)]


class PositionsRequest(ModelRequest):
    count: int = Field(64, ge=2, le=256)
    distance: int = Field(256, ge=1, le=4096)


class RepeatRequest(ModelRequest):
    prompt: str = Field(min_length=1, max_length=10_000)
    max_tokens: int = Field(24, ge=1, le=128)
    seed: int = Field(0, ge=0, le=2**31 - 1)


class SpeculativeRequest(ModelRequest):
    prompt: str = Field(min_length=1, max_length=10_000)
    max_tokens: int = Field(48, ge=1, le=256)
    draft_tokens: int = Field(DRAFT_TOKENS, **DRAFT_TOKENS_BOUND.limits(), description=DRAFT_TOKENS_BOUND.meaning)
    temperature: float = bounded("temperature", 0.0, le=2.0)
    seed: int = bounded("seed", 0)


class LengthRequest(ModelRequest):
    prompt: str = Field(min_length=1, max_length=10_000)
    lengths: Annotated[list[Annotated[int, Field(ge=1, le=1000)]], Field(min_length=1, max_length=4)] = [50, 500]
    price_input: Price = 0.15
    price_output: Price = 0.60


def round5(x):
    """Floats to 5 significant digits, through lists, tuples, dicts and tensors: round5(1/3) == 0.33333"""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, float):
        return float(f"{x:.5g}")
    if isinstance(x, (list, tuple)):
        return [round5(v) for v in x]
    if isinstance(x, dict):
        return {k: round5(v) for k, v in x.items()}
    return x


def install_lesson(router: APIRouter, explainer) -> None:
    """Add the lesson's routes to the explainer's route table (lesson/routes.py)."""
    _install_session_views(router, explainer)
    _install_model_views(router, explainer)
    _install_experiments(router, explainer)
    _install_speculative(router, explainer)
    install_traces(router, explainer)


async def _off_loop(explainer, served, compute):
    """compute() in a worker thread under the model's lock: torch work never blocks the event loop,
    and never runs beside another explainer request on the same model."""
    async with explainer.state(served).lock:
        return await anyio.to_thread.run_sync(compute)


def _install_session_views(router: APIRouter, explainer) -> None:
    async def inspected(key: str, node: int | None):
        opened = explainer.session(key)
        session = opened.session
        node_id = session.node(session.current if node is None else node).id
        async with explainer.state(opened.served).lock:
            inspection = await anyio.to_thread.run_sync(lambda: session.inspect(node_id))
        return opened, node_id, inspection

    @router.post("/explain/sessions/{key}/lens")
    async def lens_view(key: str, body: LensRequest):
        opened, node_id, inspection = await inspected(key, body.node)
        served = opened.served
        view = await _off_loop(explainer, served, lambda: lesson.lens(served.model, served.tokenizer, inspection,
                                                                      body.position, body.top_n))
        return round5({"node": node_id, **view, "tokens": _texts(served.tokenizer, inspection.ids)})

    @router.post("/explain/sessions/{key}/attention")
    async def attention_view(key: str, body: AttentionRequest):
        """A recurrent layer attends to nothing: its answer has no weights, and says what it keeps."""
        opened, node_id, inspection = await inspected(key, body.node)
        kinds = opened.session.layers
        if body.layer >= len(kinds):
            inspection.entry(body.layer)  # the error naming the range
        kind = kinds[body.layer]
        matrix = None if kind.recurrent else await _off_loop(
            explainer, opened.served, lambda: lesson.attention_matrix(inspection, body.layer, body.head))
        return round5({"node": node_id, **kind.as_json(), "head": body.head, "layers": len(kinds),
                       "heads": inspection.weights.shape[1], "tokens": _texts(opened.served.tokenizer, inspection.ids),
                       "weights": matrix})

    @router.post("/explain/sessions/{key}/attention/detail")
    async def attention_detail(key: str, body: DetailRequest):
        opened, node_id, inspection = await inspected(key, body.node)
        detail = await _off_loop(explainer, opened.served,
                                 lambda: lesson.attention_detail(inspection, body.layer, body.head, body.query))
        return round5({"node": node_id, **detail, "tokens": _texts(opened.served.tokenizer, inspection.ids)})


def _install_model_views(router: APIRouter, explainer) -> None:
    @router.post("/explain/tokens")
    async def tokens(body: TokensRequest):
        tokenizer = explainer.served_for(body.model).tokenizer
        pieces = [{"id": p.id, "text": p.text, "bytes": p.bytes.hex(" ")}
                  for p in tokenizer.pieces(tokenizer.encode(body.text, allow_special=False))]
        count = len(pieces)
        cost_in, cost_out = lesson.cost(count, body.price_input), lesson.cost(body.output_tokens, body.price_output)
        return {"pieces": pieces, "tokens": count, "characters": len(body.text), "words": len(body.text.split()),
                "input_cost": cost_in, "output_cost": cost_out, "cost": cost_in + cost_out,
                "price_input": body.price_input, "price_output": body.price_output,
                "output_tokens": body.output_tokens}

    @router.post("/explain/embeddings")
    async def embeddings(body: EmbeddingRequest):
        served = explainer.served_for(body.model)
        model, tokenizer = served.model, served.tokenizer
        ids, vector = await _off_loop(explainer, served, lambda: lesson.word_vector(model, tokenizer, body.word))
        found = await _off_loop(explainer, served, lambda: lesson.neighbors(model, vector, body.k, exclude=ids))
        return round5({"word": body.word, "pieces": _texts(tokenizer, ids), "dimensions": vector.shape[-1],
                       "norm": float(vector.norm()), "vector": vector[:16],
                       "neighbors": [{"id": i, "text": lesson.token_text(tokenizer, i), "cosine": c}
                                     for i, c in found]})

    @router.post("/explain/embeddings/map")
    async def embedding_map(body: MapRequest):
        served = explainer.served_for(body.model)
        def compute():
            vectors = torch.stack([lesson.word_vector(served.model, served.tokenizer, w)[1] for w in body.words])
            return vectors, *lesson.pca_map(vectors), lesson.cosine_matrix(vectors)
        vectors, coords, share, cosine = await _off_loop(explainer, served, compute)
        return round5({"words": body.words, "points": coords, "explained": share, "cosine": cosine})

    @router.post("/explain/positions")
    async def positions(body: PositionsRequest):
        served = explainer.served_for(body.model)
        return round5(await _off_loop(explainer, served, lambda: lesson.positions(served.model, body.count,
                                                                                 body.distance)))


def _install_experiments(router: APIRouter, explainer) -> None:
    @router.post("/explain/experiments/repeat")
    async def repeat(body: RepeatRequest):
        """Each run recorded as a trace, and each pair compared as `nexttok diff` compares them."""
        served = explainer.served_for(body.model)
        settings = [(0.0, None), (0.0, None), (1.0, body.seed + 1), (1.0, body.seed + 2)]
        sha256 = await anyio.to_thread.run_sync(lambda: served_sha256(served, "model"))

        def run():
            ids = prompt_ids_for(served.model, served.tokenizer, body.prompt)
            return [lesson_trace(served, sha256, body.prompt, ids, SamplingParams(temperature=t, seed=s),
                                 body.max_tokens, f"run {k + 1}") for k, (t, s) in enumerate(settings)]

        traces = await _off_loop(explainer, served, run)
        runs = [{"temperature": t, "seed": s, "text": trace.text, "finish_reason": trace.end["finish_reason"],
                 "tokens": [{"id": step["id"], "text": step["token_text"]} for step in trace.steps],
                 "trace": trace_lines(trace)} for (t, s), trace in zip(settings, traces, strict=True)]
        diffs = {"temperature_0": diff_traces(traces[0], traces[1]),
                 "temperature_1": diff_traces(traces[2], traces[3])}
        return {"runs": runs, "diffs": {pair: diff_view(d) for pair, d in diffs.items()},
                "divergence": {pair: None if d.identical else d.divergence.index for pair, d in diffs.items()}}

    @router.post("/explain/experiments/length")
    async def length(body: LengthRequest):
        served = explainer.served_for(body.model)

        def run():  # stop tokens off: each run makes exactly its number of tokens
            return [generate(served.model, served.tokenizer, body.prompt, SamplingParams(temperature=0),
                             max_tokens=n, stop_token_ids=[]) for n in body.lengths]

        async with explainer.state(served).lock:
            done = await anyio.to_thread.run_sync(run)
        return round5({"price_input": body.price_input, "price_output": body.price_output,
                       "runs": [_length_run(c, body) for c in done]})


def _install_speculative(router: APIRouter, explainer) -> None:
    @router.post("/explain/experiments/speculative")
    async def speculative(body: SpeculativeRequest):
        """Prompt lookup drafts verified by the model (generation/speculative.py), token by token."""
        served = explainer.served_for(body.model)
        rounds = Rounds()
        params = SamplingParams(temperature=body.temperature, seed=body.seed)

        def run():
            return list(speculative_stream(served.model, served.tokenizer, body.prompt, params, NgramDrafter(),
                                           k=body.draft_tokens, rounds=rounds, max_tokens=body.max_tokens,
                                           top_n=SPECULATIVE_ROWS))

        steps = await _off_loop(explainer, served, run)
        refused = {r.index: r for r in rounds.refusals}
        return round5({"drafter": NgramDrafter.name, "draft_tokens": body.draft_tokens,
                       "temperature": body.temperature, "seed": body.seed, "greedy": params.temperature == 0,
                       "tokens": [_drafted(served.tokenizer, s, refused.get(s.index)) for s in steps],
                       "text": "".join(s.text for s in steps), "finish_reason": steps[-1].finish_reason,
                       "drafted": rounds.drafted, "accepted": rounds.accepted, "rejected": len(rounds.refusals),
                       "forwards": rounds.forwards, "acceptance": rounds.acceptance,
                       "tokens_per_forward": rounds.tokens_per_forward})


def _drafted(tokenizer, step, refusal: Refusal | None) -> dict:
    """A token of a speculative run and its draft: undrafted, accepted, or rejected (with the
    proposal, its probability, and the distribution the rule read there: the chain's top rows)."""
    token = {"index": step.index, "id": step.token_id, "text": step.token_text}
    if step.draft is None:
        return {**token, "state": "undrafted"}
    if step.draft.accepted:
        return {**token, "state": "accepted"}
    assert refusal is not None and refusal.token_id == step.draft.token_id  # Rounds records every refusal
    return {**token, "state": "rejected",
            "proposal": {"id": refusal.token_id, "text": lesson.token_text(tokenizer, refusal.token_id),
                         "p": refusal.p},
            "rows": [{"id": a.id, "text": a.text, "p": math.exp(a.logprob)} for a in step.top_filtered]}


def _length_run(completion, body: LengthRequest) -> dict:
    steps = [s.elapsed for s in completion.steps]
    decode = steps[1:] or steps
    cost_in = lesson.cost(completion.prompt_tokens, body.price_input)
    cost_out = lesson.cost(completion.completion_tokens, body.price_output)
    return {"prompt_tokens": completion.prompt_tokens, "tokens": completion.completion_tokens,
            "seconds": completion.elapsed, "first_token_seconds": steps[0],
            "seconds_per_token": sum(decode) / len(decode), "step_seconds": steps,
            "input_cost": cost_in, "output_cost": cost_out, "cost": cost_in + cost_out}


def _texts(tokenizer, ids: list[int]) -> list[dict]:
    return [{"id": i, "text": lesson.token_text(tokenizer, i)} for i in ids]
