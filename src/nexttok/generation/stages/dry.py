"""DRY, "Don't Repeat Yourself" (p-e-w's, as llama.cpp runs it): a penalty on the token that would
extend a repetition of what is already in the context, growing exponentially with its length.

Within the last penalty_last_n tokens (the prompt counts; -1: the whole context), for every earlier
place where the tokens before it equal the last n tokens of the context, the token that followed
there would make the repeat n + 1 long; when n >= allowed_length its logit loses
multiplier * base ** (n - allowed_length) (the longest such n per token; the exponent capped where
the float would overflow). A repetition may not reach back past a sequence breaker (by default a
newline, ':', '"', '*'): text after one starts afresh, so list markers and dialogue names do not
count. The lengths come from the Z-algorithm over the reversed window, in linear time.

Breakers are strings; a token "is" one when its text holds the string, and "starts" one when its text
ends with the string's beginning and the rest, tokenized, follows it (llama.cpp's
get_overlapping_token_sequences). Only the tokens in the window are ever asked about, so they are
found one token at a time, when first seen, not over the whole vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nexttok.generation.stages.spec import Bound, ChainContext, StageSpec, Strings

MAX_TAIL = 20  # tokens of a breaker's tail (llama.cpp's MAX_SEQ_LEN)
FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: where base ** exponent overflows

Tails = tuple[tuple[int, ...], ...]


class TokenBreakers:
    """Breakers given as token sequences (a head token and its tail), as llama.cpp's tests give them."""

    def __init__(self, sequences: Sequence[Sequence[int]]):
        self.table: dict[int, Tails] = {}
        for sequence in sequences:
            head, tail = sequence[0], tuple(sequence[1:])
            self.table[head] = (*self.table.get(head, ()), tail)

    def tails(self, token: int) -> Tails:
        return self.table.get(token, ())


class TextBreakers:
    """Breakers given as strings, found in a token's text when first asked (see the module's docstring)."""

    def __init__(self, strings: Sequence[str], tokenizer):
        self.strings = [s.encode("utf-8") for s in strings]
        self.tokenizer = tokenizer
        self.known: dict[int, Tails] = {}
        self.rests: dict[bytes, tuple[int, ...]] = {}

    def tails(self, token: int) -> Tails:
        if token not in self.known:
            self.known[token] = self._find(token)
        return self.known[token]

    def _find(self, token: int) -> Tails:
        try:
            word = self.tokenizer.decode_bytes([token])
        except ValueError:  # a padding row past the tokenizer's vocabulary: no text
            return ()
        found: list[tuple[int, ...]] = []
        for breaker in self.strings:
            if breaker in word:
                found.append(())
                continue
            at = word.find(breaker[:1])
            while at >= 0:
                if breaker.startswith(word[at:]):  # the word ends inside the breaker
                    tail = self._tail(breaker[len(word) - at:])
                    if tail not in found:
                        found.append(tail)
                at = word.find(breaker[:1], at + 1)
        return tuple(found)

    def _tail(self, rest: bytes) -> tuple[int, ...]:
        if rest not in self.rests:
            text = rest.decode("utf-8", errors="replace")
            self.rests[rest] = tuple(self.tokenizer.encode(text, allow_special=False, add_special=False)[:MAX_TAIL])
        return self.rests[rest]


class DRY:
    """The DRY stage (see the module's docstring); it keeps the context: the prompt and each accepted token."""

    name = "dry"

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int, breakers,
                 prompt_ids: Sequence[int] = ()):
        self.multiplier, self.base, self.allowed, self.last_n = multiplier, base, allowed_length, last_n
        self.breakers, self.prompt = breakers, list(prompt_ids)
        self.context = self._window(self.prompt)
        self.cap = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
        self.note = ""

    def _window(self, tokens: list[int]) -> list[int]:
        return tokens[len(tokens) - self.last_n:] if 0 < self.last_n < len(tokens) else list(tokens)

    def accept(self, token_id: int) -> None:
        self.context.append(token_id)
        if 0 < self.last_n < len(self.context):
            del self.context[0]

    def reset(self) -> None:
        self.context = self._window(self.prompt)

    def clone(self, uniforms) -> DRY:
        copy = DRY(self.multiplier, self.base, self.allowed, self.last_n, self.breakers)
        copy.prompt, copy.context = self.prompt, list(self.context)
        return copy

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        lengths = {t: n for t, n in self.repeats().items() if () not in self.breakers.tails(t)}
        self.note = f"{len(lengths)} tokens would extend a repeat" if lengths else "no repeat to extend"
        if not lengths:
            return logits
        ids = torch.tensor(list(lengths), dtype=torch.long, device=logits.device)
        exponents = [n - self.allowed if not self.cap else min(n - self.allowed, self.cap) for n in lengths.values()]
        penalty = torch.tensor([self.multiplier * self.base**e for e in exponents], device=logits.device)
        return logits.index_put((ids,), logits[ids] - penalty.to(logits.dtype))

    def repeats(self) -> dict[int, int]:
        """Each token that would extend a repeat of at least allowed_length, and the longest such repeat."""
        reverse = self.context[::-1]  # reverse[i]: i tokens before the last
        size = len(reverse)
        if size <= self.allowed:
            return {}
        limit = self._limit(reverse)
        if limit < self.allowed:
            return {}
        found: dict[int, int] = {}
        for k, match in enumerate(z_array(reverse)[1:], start=1):  # the suffix ending k tokens back
            n = min(match, limit)
            if n >= self.allowed and found.get(reverse[k - 1], -1) < n:
                found[reverse[k - 1]] = n  # reverse[k - 1] followed it
        return found

    def _limit(self, reverse: list[int]) -> int:
        """How far back a repeat may reach: to the end of the nearest complete breaker sequence."""
        for i, token in enumerate(reverse):
            longest = -1
            for tail in self.breakers.tails(token):
                if longest < len(tail) <= i and all(tail[o] == reverse[i - o - 1] for o in range(len(tail))):
                    longest = len(tail)
            if longest >= 0:
                return i - longest
        return len(reverse)


def z_array(s: Sequence[int]) -> list[int]:
    """z[k]: the length of the longest common prefix of s and s[k:] (z[0] = len(s)).
    z_array([1, 2, 1, 2, 3]) == [5, 0, 2, 0, 0]."""
    n = len(s)
    z, left, right = [0] * n, 0, 0
    if n:
        z[0] = n
    for k in range(1, n):
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
    return z


def _dry(p, context: ChainContext) -> DRY:
    if p.dry_sequence_breakers and context.tokenizer is None:
        raise ValueError("DRY's sequence breakers are text: the chain needs the model's tokenizer")
    strings = p.dry_sequence_breakers
    breakers = TextBreakers(strings, context.tokenizer) if strings else TokenBreakers([])
    return DRY(p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n, breakers, context.prompt_ids)


DRY_SPEC = StageSpec(
    name="dry",
    settings={
        "dry_multiplier": Bound(0.0, 0.0, math.inf, "DRY: the penalty on a token that extends a repetition is "
                                "multiplier * base ** (length - allowed length); 0 = off", dial_high=3.0),
        "dry_base": Bound(1.75, 1.0, math.inf, "DRY: how fast the penalty grows with the repetition's length",
                          dial_high=4.0),
        "dry_allowed_length": Bound(2, 0, math.inf, "DRY: repetitions up to this many tokens go unpenalized",
                                    integer=True, dial_high=10),
        "dry_penalty_last_n": Bound(64, -1, math.inf, "DRY: how many of the last tokens are scanned for "
                                    "repetitions; -1 = the whole context, 0 = off", integer=True, dial_high=512),
        "dry_sequence_breakers": Strings(("\n", ":", '"', "*"), "DRY: text that ends a repetition (a repeat "
                                         "never reaches back past one)", flag="dry-sequence-breaker"),
    },
    use="Against loops in long chats and stories: a repeated run of tokens costs more the longer it gets, "
        "while single repeated words (names, 'the') go free.",
    active=lambda p: p.dry_multiplier > 0 and p.dry_penalty_last_n != 0,
    build=_dry, greedy=True, needs=frozenset({"history", "tokenizer"}), reweights=True,
)
