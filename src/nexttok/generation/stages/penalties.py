"""Stages that change chosen tokens' values: the repetition penalties and logit bias.

Penalties keep a History of the prompt and of each accepted token; repeat_last_n narrows it to the
last n tokens (llama.cpp's penalty_last_n). Repetition (HF/CTRL) counts every token seen, prompt
included; presence and frequency (OpenAI) count generated tokens only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.stages.spec import Bound, ChainContext, StageSpec, Stateless, TokenBiases


def check_token_ids(bias: Mapping[int, float], vocab_size: int) -> None:
    """What needs the model: logit_bias ids in its vocabulary.
    check_token_ids({9: 1.0}, 4) raises: 'logit_bias token id 9 is outside the vocabulary (0..3)'."""
    too_big = [t for t in bias if t >= vocab_size]
    if too_big:
        raise InvalidParameter("logit_bias", f"logit_bias token id {too_big[0]} is outside the "
                               f"vocabulary (0..{vocab_size - 1})")


@dataclass
class History:
    """Tokens seen so far, for penalties: the prompt and what was generated (as counts), all of it
    or (last_n >= 1) only the last last_n tokens of the two together."""

    prompt: torch.Tensor  # (T,) long
    generated_counts: torch.Tensor  # (vocab,) float: how often each token was generated
    generated: list[int] | None = None  # in order (kept where a window needs it)
    last_n: int = -1  # -1: the whole history

    @classmethod
    def start(cls, prompt_ids: Sequence[int], vocab_size: int, device="cpu", last_n: int = -1) -> History:
        return cls(torch.tensor(list(prompt_ids), dtype=torch.long, device=device),
                   torch.zeros(vocab_size, device=device), [], last_n)

    def add(self, token_id: int) -> None:
        self.generated_counts[token_id] += 1
        self.generated.append(token_id)

    def reset(self) -> None:
        self.generated_counts.zero_()
        self.generated.clear()

    def copy(self) -> History:
        return History(self.prompt, self.generated_counts.clone(), list(self.generated), self.last_n)

    def seen_mask(self) -> torch.Tensor:
        """(vocab,) bool: in the prompt or generated (within the window)."""
        if self.last_n < 0:
            seen = self.generated_counts > 0
            prompt = self.prompt
        else:
            seen = self.counts() > 0
            room = self.last_n - min(self.last_n, len(self.generated))
            prompt = self.prompt[self.prompt.shape[0] - min(room, self.prompt.shape[0]):]
        seen[prompt[prompt < seen.shape[0]]] = True
        return seen

    def counts(self) -> torch.Tensor:
        """(vocab,) how often each token was generated (within the window)."""
        if self.last_n < 0:
            return self.generated_counts
        window = self.generated[len(self.generated) - min(self.last_n, len(self.generated)):]
        ids = torch.tensor(window, dtype=torch.long, device=self.generated_counts.device)
        return torch.bincount(ids, minlength=self.generated_counts.shape[0]).to(self.generated_counts.dtype)


class Penalties:
    """Repetition (on every token seen, prompt included), presence and frequency (on generated
    tokens) penalties, over the history this stage keeps."""

    name = "penalties"

    def __init__(self, repetition: float, presence: float, frequency: float, history: History):
        self.repetition, self.presence, self.frequency, self.history = repetition, presence, frequency, history

    def accept(self, token_id: int) -> None:
        self.history.add(token_id)

    def reset(self) -> None:
        self.history.reset()

    def clone(self, uniforms) -> Penalties:
        return Penalties(self.repetition, self.presence, self.frequency, self.history.copy())

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.repetition != 1.0:
            seen = self.history.seen_mask()
            scaled = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, scaled, logits)
        if self.frequency or self.presence:
            counts = self.history.counts()
            if self.frequency:
                logits = logits - self.frequency * counts
            if self.presence:
                logits = logits - self.presence * (counts > 0).to(logits.dtype)
        return logits


class LogitBias(Stateless):
    name = "logit_bias"

    def __init__(self, bias: dict[int, float], vocab_size: int):
        check_token_ids(bias, vocab_size)
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[self.ids.to(logits.device)] += self.values.to(logits.device, logits.dtype)
        return logits


def _penalties(p, context: ChainContext) -> Penalties:
    history = History.start(context.prompt_ids, context.vocab_size, context.device, p.repeat_last_n)
    return Penalties(p.repetition_penalty, p.presence_penalty, p.frequency_penalty, history)


PENALTIES = StageSpec(
    name="penalties",
    settings={
        "repetition_penalty": Bound(1.0, 0.0, 100.0, "HF/CTRL: divide the positive logits of tokens in the prompt "
                                    "or the output by this, multiply the negative ones; 1 = off",
                                    low_open=True, dial_high=2.0),
        "presence_penalty": Bound(0.0, -2.0, 2.0, "OpenAI: subtract this once from every token already "
                                  "generated; 0 = off"),
        "frequency_penalty": Bound(0.0, -2.0, 2.0, "OpenAI: subtract this times how often a token was "
                                   "generated; 0 = off"),
        "repeat_last_n": Bound(-1, -1, math.inf, "the penalties look at the last n tokens only (prompt and "
                               "output together); -1 = all of them, 0 = penalties off", integer=True,
                               dial_high=256),
    },
    use="Against a model that repeats itself word for word: tokens it already used become less likely "
        "(presence and frequency are OpenAI's, repetition HF's).",
    active=lambda p: p.repeat_last_n != 0 and (p.repetition_penalty != 1 or p.presence_penalty != 0
                                               or p.frequency_penalty != 0),
    build=_penalties, greedy=True, needs=frozenset({"history"}), reweights=True,
)

LOGIT_BIAS = StageSpec(
    name="logit_bias",
    settings={"logit_bias": TokenBiases(Bound(0.0, -100.0, 100.0, "added to the logit of a token id, before "
                                              "the filters"), "token id -> a number added to its logit "
                                        "(-100 bans it, +100 all but forces it)")},
    use="To ban a token (-100) or favour one: a fixed number added to chosen tokens' logits.",
    active=lambda p: bool(p.logit_bias),
    build=lambda p, context: LogitBias(p.logit_bias, context.vocab_size),
    greedy=True, reweights=True,
)
