"""An explainer session: generation one step at a time, over a tree of continuations.

The page (and anything else) asks for one step; the session runs the model on whatever part of
the chosen path the KV cache does not hold yet (the whole prompt the first time, one token after
that), samples with the dials it is given, and returns the Step record plus what a viewer shows:
the model's top tokens with their probabilities before and after the sampler chain, the attention
of the last position in each attention layer (and in a mixture of experts the router's choice
there), the timings, and what the cache holds per layer type (lesson.layers).
`redraw` re-runs the chain on a node's cached logits with other dials (no model call).
Any node of the tree can be continued with any token (a branch); the cache keeps the longest
prefix it shares with the new path and recomputes only the rest.

Sampling goes through exactly the generation loop's path: a SamplerChain built from the params and
the prompt, told the node's path with `accept`, sampling with the node's own random numbers (the
draw's u, XTC's chance); the Step is made by generate.build_step. A chain whose state is more than
the tokens of the path (Mirostat's mu, moved by each step's distribution) is kept per node: a step
with the dials that made the node goes on from it, as a generation would; other dials start afresh.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.loop import Step, build_step, context_window, prompt_ids_for
from nexttok.generation.sampling import Sample, SamplerChain, SamplingParams, Uniforms
from nexttok.lesson import sections as lesson
from nexttok.lesson.experts import LayerRouting, routing_at
from nexttok.lesson.layers import LayerKind, cache_memory, layer_table
from nexttok.models import Model
from nexttok.models.attention import AttentionCapture
from nexttok.models.cache import KVCache
from nexttok.tokenizers.detokenizer import IncrementalDetokenizer
from nexttok.tokenizers.tokenizer import Tokenizer

MAX_NODES = 2000
KEPT_DISTRIBUTIONS = 64  # nodes whose logits stay in memory for re-drawing (older ones recompute)
KEPT_INSPECTIONS = 4  # nodes whose full capture (lens, attention matrices) stays in memory


@dataclass
class Node:
    """A point in the tree: the prompt (root) or the prompt plus the tokens down to here."""

    id: int
    parent: int | None
    token_id: int | None  # the token that leads here from the parent (None for the root)
    depth: int  # generated tokens on the path
    children: list[int] = field(default_factory=list)
    # the random numbers of steps from here, by use ("draw": the draw's u, "xtc": XTC's chance), each
    # taken from the session's stream when first needed and kept: dials compare like with like
    draws: dict[str, float] = field(default_factory=dict)
    made: Made | None = None  # how the step that leads here went (None for the root)

    @property
    def draw(self) -> float | None:
        """The draw's u from here (None: nothing drawn yet)."""
        return self.draws.get("draw")


class NodeDraws:
    """A node's random numbers as a chain's stream: each use's first number comes from the session's
    seeded stream, and is the node's from then on."""

    def __init__(self, node: Node, stream: Uniforms):
        self.node, self.stream = node, stream

    def next(self, purpose: str = "draw") -> float:
        if purpose not in self.node.draws:
            self.node.draws[purpose] = self.stream.next(purpose)
        return self.node.draws[purpose]


@dataclass
class Made:
    """The step that made a node, as the session recorded it: its Step, the dials it was sampled
    with, and whether its forward pass used the KV cache."""

    step: Step
    params: SamplingParams
    cached: bool


@dataclass
class PathRun:
    """The path to a node as one generation: its Steps (each with the text it releases, the last
    with why the run ends there), the dials every step used (with the session's seed), and whether
    every forward pass used the KV cache."""

    steps: list[Step]
    params: SamplingParams
    use_cache: bool


@dataclass
class Forward:
    logits: torch.Tensor  # (vocab,) at the end of the path
    attention: list[torch.Tensor]  # per attention layer (n_head, S): the last position over every key
    tokens: int  # positions computed by this forward pass
    seconds: float
    prefill: bool
    cached: bool = True  # the KV cache was used (False: the whole sequence went through the model again)
    experts: list[LayerRouting] = field(default_factory=list)  # per sparse layer: the router at the last position
    layers: list[int] = field(default_factory=list)  # the model's layer of each attention entry


class ExplainSession:
    def __init__(self, model: Model, tokenizer: Tokenizer, prompt: str | list[int], *, max_len: int = 1024,
                 seed: int | None = None):
        self.model, self.tokenizer, self.seed = model, tokenizer, seed
        self.prompt_text = prompt if isinstance(prompt, str) else None
        config = model.config
        limit = context_window(config, max_len)
        self.prompt_ids = prompt_ids_for(model, tokenizer, prompt, limit)
        parameter = next(model.parameters())
        self.cache = KVCache.for_model(config, max_len=limit, dtype=parameter.dtype, device=parameter.device)
        self.cached: list[int] = []  # the tokens whose keys/values the cache holds, in order
        self.nodes: dict[int, Node] = {0: Node(0, None, None, 0)}
        self.current = 0
        # Each node's numbers (the draw's u, XTC's chance) are taken, the first time a step from it needs
        # one, from the same seeded stream a SamplerChain draws from, in the order a chain asks. So a
        # session walking one path with one seed uses exactly the numbers generate() with that seed
        # uses (and picks the same tokens), while a node keeps them when it is stepped again or
        # re-drawn with other dials (NodeDraws).
        self.uniforms = Uniforms(seed)
        self._forwards: OrderedDict[int, Forward] = OrderedDict()  # node -> its distribution
        self._chains: OrderedDict[int, tuple[SamplingParams, SamplerChain]] = OrderedDict()  # node -> chain there
        self._inspections: OrderedDict[int, lesson.Inspection] = OrderedDict()
        self.stop_ids = list(config.eos_token_id)
        self.layers: list[LayerKind] = layer_table(model)  # each layer's type; recurrent states measured

    # -- the tree ----------------------------------------------------------------------------

    def node(self, node_id: int) -> Node:
        if node_id not in self.nodes:
            raise InvalidParameter("node", f"node {node_id} does not exist in this session")
        return self.nodes[node_id]

    def path(self, node_id: int) -> list[int]:
        """Generated token ids from the prompt's end down to node_id."""
        tokens = []
        node = self.node(node_id)
        while node.parent is not None:
            tokens.append(node.token_id)
            node = self.nodes[node.parent]
        return tokens[::-1]

    def child(self, parent_id: int, token_id: int) -> Node:
        """The child of parent with this token, created when new."""
        parent = self.node(parent_id)
        if not (type(token_id) is int and 0 <= token_id < self.model.config.vocab_size):
            raise InvalidParameter("token_id", f"token_id must be in 0..{self.model.config.vocab_size - 1}")
        for child_id in parent.children:
            if self.nodes[child_id].token_id == token_id:
                return self.nodes[child_id]
        if len(self.nodes) >= MAX_NODES:
            raise InvalidParameter("node", f"the session's tree is full ({MAX_NODES} nodes)")
        if len(self.prompt_ids) + parent.depth + 1 >= self.cache.max_len:
            raise InvalidParameter("node", "the context window of this session is full", "context_length_exceeded")
        node = Node(len(self.nodes), parent_id, token_id, parent.depth + 1)
        self.nodes[node.id] = node
        parent.children.append(node.id)
        return node

    # -- model -------------------------------------------------------------------------------

    def forward(self, node_id: int, use_cache: bool = True) -> Forward:
        """The next-token distribution at node_id, computing only what the cache lacks (use_cache:
        False runs the whole sequence through the model again, as a loop without a cache would)."""
        if node_id in self._forwards:
            self._forwards.move_to_end(node_id)
            return self._forwards[node_id]
        tokens = self.prompt_ids + self.path(node_id)
        result = self._forward(tokens) if use_cache else self._uncached(tokens)
        self._forwards[node_id] = result
        if len(self._forwards) > KEPT_DISTRIBUTIONS:
            self._forwards.popitem(last=False)
        return result

    def _forward(self, tokens: list[int]) -> Forward:
        shared = 0
        while shared < min(len(tokens), len(self.cached)) and tokens[shared] == self.cached[shared]:
            shared += 1
        shared = min(shared, len(tokens) - 1)  # at least the last token goes through the model
        if self.cache.state_layers and shared < len(self.cached):  # a recurrent state goes back only to the start
            shared = 0
        self.cache.truncate(shared)
        pending = torch.tensor([tokens[shared:]], device=self.cache.device)
        capture = AttentionCapture()
        start = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(pending, self.cache, capture=capture, last_only=True)[0, -1].float()
        seconds = time.perf_counter() - start
        self.cached = tokens
        return Forward(logits, [a[0] for a in capture.last_query], len(tokens) - shared, seconds, shared == 0,
                       experts=routing_at(capture.experts), layers=list(capture.layers))

    def _uncached(self, tokens: list[int]) -> Forward:
        ids = torch.tensor([tokens], device=self.cache.device)
        capture = AttentionCapture()
        start = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(ids, None, capture=capture, last_only=True)[0, -1].float()
        seconds = time.perf_counter() - start
        return Forward(logits, [a[0] for a in capture.last_query], len(tokens), seconds, False, cached=False,
                       experts=routing_at(capture.experts), layers=list(capture.layers))

    def inspect(self, node_id: int) -> lesson.Inspection:
        """The full capture of the path to node_id (lens, attention matrices, q/k/v): one extra
        forward pass, made only when a viewer asks, kept for the last few nodes."""
        if node_id not in self._inspections:
            self._inspections[node_id] = lesson.inspect(self.model, self.prompt_ids + self.path(node_id))
            if len(self._inspections) > KEPT_INSPECTIONS:
                self._inspections.popitem(last=False)
        self._inspections.move_to_end(node_id)
        return self._inspections[node_id]

    # -- sampling ----------------------------------------------------------------------------

    def _sample(self, params: SamplingParams, node: Node, forward: Forward) -> tuple[Sample, SamplerChain]:
        """The sampler chain of `params` on the node's logits, as Generation runs it (its seconds count
        the chain's building too), and the chain, for the step to tell the token it keeps."""
        start = time.perf_counter()
        chain = self._chain_at(params, node)
        chosen = chain.sample(forward.logits, record=True)
        return dataclasses.replace(chosen, seconds=time.perf_counter() - start), chain

    def _chain_at(self, params: SamplingParams, node: Node) -> SamplerChain:
        """The chain of params as it stands at node, drawing the node's numbers: the one kept there
        when the node was made with these dials (a copy), else one built from the prompt and told
        the node's path."""
        draws = NodeDraws(node, self.uniforms)
        kept = self._chains.get(node.id)
        if kept is not None and kept[0] == params:
            self._chains.move_to_end(node.id)
            return kept[1].clone(draws)
        chain = SamplerChain.from_params(params, self.model.config.vocab_size, self.prompt_ids,
                                         self._device(), uniforms=draws, tokenizer=self.tokenizer)
        for token in self.path(node.id):
            chain.accept(token)
        return chain

    def _device(self):
        return self.cache.k.device

    def _keep_chain(self, node_id: int, params: SamplingParams, chain: SamplerChain) -> None:
        self._chains[node_id] = (params, chain)
        self._chains.move_to_end(node_id)
        if len(self._chains) > KEPT_DISTRIBUTIONS:
            self._chains.popitem(last=False)

    def step(self, params: SamplingParams, node_id: int | None = None, token_id: int | None = None,
             top_n: int = 10, use_cache: bool = True) -> dict:
        """One token from node_id (default: the current node): sampled with params, or token_id
        when given (continue with an alternative). The new node becomes current."""
        node = self.node(self.current if node_id is None else node_id)
        forward = self.forward(node.id, use_cache)
        sampled, chain = self._sample(params, node, forward)
        child = self.child(node.id, sampled.token_id if token_id is None else token_id)
        chain.accept(child.token_id)
        self._keep_chain(child.id, params, chain)
        self.current = child.id
        child.made = Made(self._step(node, child.token_id, forward, sampled, top_n), params, forward.cached)
        return {
            "node": node.id, "child": child.id, "step": child.made.step,
            **self._table(forward, sampled, top_n),
            "attention": [layer.tolist() for layer in forward.attention],  # per attention layer (n_head, S)
            "attention_mean": [layer.mean(0).tolist() for layer in forward.attention],  # per attention layer (S,)
            "attention_layers": forward.layers,  # the model's layer of each entry (recurrent layers have none)
            # per sparse layer, the router's choice for the token predicted from; None: a dense model
            "experts": [r.as_json() for r in forward.experts] if self.model.config.is_moe else None,
            "timing": {"tokens": forward.tokens, "seconds": forward.seconds, "prefill": forward.prefill,
                       "cached": forward.cached},
            "stop": {"ids": self.stop_ids, "p": lesson.stop_probability(self.model, forward.logits, self.stop_ids),
                     "reason": self.finish_reason(child)},
            "cache": self.cache_facts(), "context": {"used": len(self.prompt_ids) + child.depth,
                                                     "limit": self.cache.max_len},
        }

    def finish_reason(self, node: Node) -> str | None:
        """Why a generation that reached node would end there: "stop" (a stop token), "length" (the
        context window is full), or None (it goes on)."""
        if node.token_id in self.stop_ids:
            return "stop"
        return "length" if len(self.prompt_ids) + node.depth >= self.cache.max_len - 1 else None

    def cache_facts(self) -> dict:
        """The KV cache now: tokens held, the bytes this session's cache (every key of every attention
        layer) takes for them, capacity in tokens, storage dtype; held: what generation's cache holds
        for this many tokens per layer type (lesson.layers.CacheMemory), and full_context: the same at
        the model's whole context window."""
        dtype, tokens = self.cache.dtype, len(self.cached)
        per_token = lesson.kv_cache_bytes_per_token(self.model, dtype)
        states = sum(layer.bytes for layer in self.layers)
        config = self.model.config
        return {"tokens": tokens, "bytes": tokens * per_token, "bytes_per_token": per_token,
                "capacity": self.cache.max_len, "dtype": str(dtype).removeprefix("torch."),
                "held": cache_memory(config, tokens, dtype, states).as_json(),
                "full_context": cache_memory(config, config.max_position_embeddings, dtype, states).as_json()}

    def redraw(self, params: SamplingParams, node_id: int, top_n: int = 10) -> dict:
        """Other dials on node_id's cached logits (no new node, usually no model call): the Step a
        step from there would make now (the token the node's u picks, what each stage kept and
        cut), and the model's top tokens with their probabilities after the chain."""
        node = self.node(node_id)
        forward = self.forward(node.id)
        sampled, _ = self._sample(params, node, forward)
        return {"node": node.id, "step": self._step(node, sampled.token_id, forward, sampled, top_n),
                **self._table(forward, sampled, top_n)}

    def _step(self, node: Node, token_id: int, forward: Forward, sampled: Sample, top_n: int) -> Step:
        return build_step(self.tokenizer, token_id, forward.logits, sampled.logits, sampled.draw, index=node.depth,
                          elapsed=forward.seconds + sampled.seconds, prefill=forward.prefill,
                          stages=sampled.stages, top_n=top_n)

    def _table(self, forward: Forward, sampled: Sample, n: int) -> dict:
        """rows: the model's n most likely tokens, raw logit and probability before (p) and after
        (q) the chain; rest: everything else — the tokens outside the top n and the probability
        they share, before and after the chain, and how many tokens the chain left a chance."""
        p, q = forward.logits.softmax(-1), sampled.logits.softmax(-1)
        top = torch.topk(p, min(n, p.shape[-1])).indices
        rows = [{"id": i, "text": self._text(i), "logit": float(forward.logits[i]), "p": float(p[i]), "q": float(q[i])}
                for i in top.tolist()]
        rest = {"tokens": p.shape[-1] - len(top), "p": max(0.0, 1 - float(p[top].sum())),
                "q": max(0.0, 1 - float(q[top].sum())), "kept": int((q > 0).sum())}
        return {"rows": rows, "rest": rest}

    def _text(self, token_id: int) -> str:
        return self.tokenizer.pieces([token_id])[0].text

    def run(self, node_id: int) -> PathRun:
        """The path to node_id as one generation (PathRun), for a trace. Refused, naming the step,
        where it is not one: nothing generated yet, steps sampled with other dials, or a path that
        goes on past a stop token (a generation ends there)."""
        path = self._made_path(node_id)
        if not path:
            raise InvalidParameter("node", "the path has no generated tokens yet: step first")
        first = path[0].params
        for made in path[1:]:
            if made.params != first:
                changed = [f.name for f in dataclasses.fields(first)
                           if getattr(made.params, f.name) != getattr(first, f.name)]
                raise InvalidParameter("node", f"step {made.step.index + 1} of the path was sampled with other "
                                       f"dials than step 1 ({', '.join(changed)}): a trace records one setting")
        detok = IncrementalDetokenizer(self.tokenizer, skip_special=True)  # as Generation releases text
        steps = []
        for i, made in enumerate(path):
            step, last = made.step, i == len(path) - 1
            stop = step.token_id in self.stop_ids
            if stop and not last:
                raise InvalidParameter("node", f"the path goes on past the stop token at step {i + 1}: "
                                       "a generation ends there")
            text = detok.flush() if stop else detok.add(step.token_id) + (detok.flush() if last else "")
            reason = ("stop" if stop else "length") if last else None  # "length": the run's max_tokens
            steps.append(dataclasses.replace(step, text=text, finish_reason=reason))
        return PathRun(steps, dataclasses.replace(first, seed=self.seed), all(m.cached for m in path))

    def _made_path(self, node_id: int) -> list[Made]:
        """The Made records from the prompt's end down to node_id."""
        made, node = [], self.node(node_id)
        while node.parent is not None:
            assert node.made is not None  # every node below the root was made by a step
            made.append(node.made)
            node = self.nodes[node.parent]
        return made[::-1]

    def goto(self, node_id: int) -> None:
        """Make node_id current: the next step continues from there."""
        self.current = self.node(node_id).id

    def tree(self) -> list[dict]:
        return [{"id": n.id, "parent": n.parent, "token_id": n.token_id, "depth": n.depth,
                 "text": self._text(n.token_id) if n.token_id is not None else "",
                 "children": list(n.children)} for n in self.nodes.values()]

    def text(self, node_id: int) -> str:
        return self.tokenizer.decode(self.path(node_id), skip_special=True)
