"""Prompt scores: the model's log-probability of each prompt token given the tokens before it.

This is how evaluation harnesses score text through an API (OpenAI's `echo` with `logprobs`,
`max_tokens: 0` for the prompt alone; lm-eval's `local-completions`): the logits at position i of
one forward pass over the prompt are the model's distribution for token i + 1, so a prompt of T
tokens gets T - 1 scores from the very prefill that starts its generation. The first token has
none (nothing comes before it): its logprob is None, as OpenAI and vLLM return it.

    scores = PromptScores(tokenizer, ids, top_n=1)
    scores.add(0, logits)   # logits (T, vocab) of positions 0..T-1 (a chunked prefill adds each chunk)
    scores.tokens[1].logprob == log_softmax(logits[0])[ids[1]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nexttok.tokenizers.detokenizer import IncrementalDetokenizer


@dataclass
class Alternative:
    """A candidate token at one position and its log-probability (Step.top, PromptToken.top)."""

    id: int
    text: str
    logprob: float


@dataclass
class PromptToken:
    id: int
    text: str  # the token's own text, for display (as Step.token_text)
    offset: int  # where the token's text starts in the decoded prompt
    logprob: float | None = None  # None for the first token
    rank: int | None = None  # 1 = the model's most likely token at this position
    top: list[Alternative] = field(default_factory=list)  # the model's top_n at this position


class PromptScores:
    """Scores of one prompt, filled chunk by chunk as the prefill computes the logits."""

    def __init__(self, tokenizer, ids: list[int], top_n: int = 0):
        self.tokenizer, self.ids, self.top_n = tokenizer, list(ids), top_n
        pieces, detok, offset = tokenizer.pieces(self.ids), IncrementalDetokenizer(tokenizer, skip_special=True), 0
        self.tokens = []
        for i, piece in zip(self.ids, pieces, strict=True):
            self.tokens.append(PromptToken(i, piece.text, offset))
            offset += len(detok.add(i))

    def add(self, start: int, logits: torch.Tensor) -> None:
        """The logits (n, vocab) of positions start..start+n-1 score tokens start+1..start+n."""
        targets = self.ids[start + 1 : start + 1 + logits.shape[0]]
        if not targets:
            return
        logprobs = torch.log_softmax(logits[: len(targets)].float(), -1)
        chosen = logprobs.gather(-1, torch.tensor(targets, device=logprobs.device)[:, None])  # (n, 1)
        ranks = ((logprobs > chosen).sum(-1) + 1).tolist()
        tops = top_alternatives(self.tokenizer, logprobs, self.top_n) if self.top_n else None
        for k, lp in enumerate(chosen[:, 0].tolist()):
            token = self.tokens[start + 1 + k]
            token.logprob, token.rank = lp, ranks[k]
            if tops is not None:
                token.top = tops[k]


def top_alternatives(tokenizer, logprobs: torch.Tensor, n: int) -> list[list[Alternative]]:
    """The n most likely tokens of each row of logprobs (rows, vocab), best first; a token the
    sampler ruled out (-inf) is none of them."""
    top = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    return [[Alternative(i, piece.text, v) for i, piece, v in zip(ids, tokenizer.pieces(ids), values, strict=True)
             if v > float("-inf")]
            for ids, values in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
