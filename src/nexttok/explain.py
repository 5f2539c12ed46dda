"""An explainer session: generation one step at a time, over a tree of continuations.

The page (and anything else) asks for one step; the session runs the model on whatever part of
the chosen path the KV cache does not hold yet (the whole prompt the first time, one token after
that), samples with the dials it is given, and returns the Step record plus what a viewer needs
to re-draw the distribution itself: the raw logits, the uniform draw u, the attention of the
last position, and the timings. Any node of the tree can be continued with any token (a branch);
the cache keeps the longest prefix it shares with the new path and recomputes only the rest.
"""

from __future__ import annotations

import base64
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from nexttok.cache import KVCache
from nexttok.errors import InvalidParameter
from nexttok.generate import RawStep, Step, make_step, prompt_ids_for
from nexttok.sampling import History, SamplerChain, SamplingParams, check_logits, pick

MAX_NODES = 2000
KEPT_DISTRIBUTIONS = 64  # nodes whose logits stay in memory for re-drawing (older ones recompute)


@dataclass
class Node:
    """A point in the tree: the prompt (root) or the prompt plus the tokens down to here."""

    id: int
    parent: int | None
    token_id: int | None  # the token that leads here from the parent (None for the root)
    depth: int  # generated tokens on the path
    children: list[int] = field(default_factory=list)
    draw: float | None = None  # the uniform number used when stepping from here (kept for comparisons)


@dataclass
class Forward:
    logits: torch.Tensor  # (vocab,) at the end of the path
    attention: list[torch.Tensor]  # per layer (n_head, S): the last position over every key
    tokens: int  # positions computed by this forward pass
    seconds: float
    prefill: bool


class ExplainSession:
    def __init__(self, model, tokenizer, prompt: str | list[int], *, max_len: int = 1024,
                 seed: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        config = model.config
        limit = min(max_len, config.max_position_embeddings)
        self.prompt_ids = prompt_ids_for(model, tokenizer, prompt, limit)
        parameter = next(model.parameters())
        self.cache = KVCache.for_model(config, max_len=limit, dtype=parameter.dtype, device=parameter.device)
        self.cached: list[int] = []  # the tokens whose keys/values the cache holds, in order
        self.nodes: dict[int, Node] = {0: Node(0, None, None, 0)}
        self.current = 0
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._forwards: OrderedDict[int, Forward] = OrderedDict()  # node -> its distribution

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

    def forward(self, node_id: int) -> Forward:
        """The next-token distribution at node_id, computing only what the cache lacks."""
        if node_id in self._forwards:
            self._forwards.move_to_end(node_id)
            return self._forwards[node_id]
        tokens = self.prompt_ids + self.path(node_id)
        shared = 0
        while shared < min(len(tokens), len(self.cached)) and tokens[shared] == self.cached[shared]:
            shared += 1
        shared = min(shared, len(tokens) - 1)  # at least the last token goes through the model
        self.cache.truncate(shared)
        pending = torch.tensor([tokens[shared:]], device=self.cache.k.device)
        attention: list = []
        start = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(pending, self.cache, attention_out=attention, last_only=True)[0, -1].float()
        seconds = time.perf_counter() - start
        self.cached = tokens
        result = Forward(logits, [a[0] for a in attention], len(tokens) - shared, seconds, shared == 0)
        self._forwards[node_id] = result
        if len(self._forwards) > KEPT_DISTRIBUTIONS:
            self._forwards.popitem(last=False)
        return result

    def step(self, params: SamplingParams, node_id: int | None = None, token_id: int | None = None,
             top_n: int = 10) -> dict:
        """One token from node_id (default: the current node): sampled with params, or token_id
        when given (continue with an alternative). The new node becomes current."""
        node = self.node(self.current if node_id is None else node_id)
        forward = self.forward(node.id)
        check_logits(forward.logits)
        if node.draw is None:
            node.draw = float(torch.rand((), generator=self.generator))
        chain = SamplerChain.from_params(params, self.model.config.vocab_size)
        history = History.start(self.prompt_ids, self.model.config.vocab_size)
        for t in self.path(node.id):
            history.add(t)
        stages: list = []
        final = chain(forward.logits, history, stages)
        chosen = token_id if token_id is not None else (
            int(torch.argmax(final)) if chain.greedy else pick(final, node.draw))
        child = self.child(node.id, chosen)
        self.current = child.id
        return self._view(node, child, forward, final, stages, top_n)

    def _view(self, node: Node, child: Node, forward: Forward, final, stages, top_n: int) -> dict:
        raw = RawStep(child.token_id, forward.logits, final, node.draw, forward.seconds, forward.prefill, stages)
        step: Step = make_step(self.tokenizer, raw, node.depth, "", None, top_n)
        return {
            "node": node.id, "child": child.id, "step": step,
            "logits": base64.b64encode(forward.logits.numpy().astype("<f4").tobytes()).decode(),
            "attention": [[[round(float(w), 4) for w in head] for head in layer] for layer in forward.attention],
            "timing": {"tokens": forward.tokens, "seconds": forward.seconds, "prefill": forward.prefill},
        }

    def goto(self, node_id: int) -> None:
        """Make node_id current: the next step continues from there."""
        self.current = self.node(node_id).id

    def tree(self) -> list[dict]:
        return [{"id": n.id, "parent": n.parent, "token_id": n.token_id, "depth": n.depth,
                 "text": self.tokenizer.pieces([n.token_id])[0].text if n.token_id is not None else "",
                 "children": list(n.children)} for n in self.nodes.values()]

    def text(self, node_id: int) -> str:
        return self.tokenizer.decode(self.path(node_id), skip_special=True)
