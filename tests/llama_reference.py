"""llama.cpp's samplers written out plainly from its rules (src/llama-sampler.cpp), as the reference the
stages are tested against. Nothing here is shared with nexttok: plain Python floats (double), a
candidate list the way llama.cpp keeps one (only the tokens still alive, sorted by logit, equal
ones by id), loops instead of tensors.

Each function takes logits as a list (float("-inf") for a token already cut) and returns the new
list (cut tokens at -inf), or for the stateful samplers the new state with it."""

from __future__ import annotations

import math

NEG_INF = float("-inf")


def candidates(logits: list[float]) -> list[tuple[int, float, float]]:
    """(id, logit, p) of the alive tokens, most likely first (equal ones by id), p the softmax."""
    alive = sorted((i for i, x in enumerate(logits) if x > NEG_INF), key=lambda i: (-logits[i], i))
    top = logits[alive[0]]
    weights = [math.exp(logits[i] - top) for i in alive]
    total = sum(weights)
    return [(i, logits[i], w / total) for i, w in zip(alive, weights, strict=True)]


def keep(logits: list[float], ids) -> list[float]:
    ids = set(ids)
    return [x if i in ids else NEG_INF for i, x in enumerate(logits)]


def pick(logits: list[float], u: float) -> int:
    """The inverse-CDF draw over the candidates, most likely first: the first whose cumulative
    probability passes u."""
    total = 0.0
    cands = candidates(logits)
    for i, _, p in cands:
        total += p
        if total > u:
            return i
    return cands[-1][0]


def top_n_sigma(logits: list[float], n: float) -> list[float]:
    """Keep logits >= max - n * std over the alive ones (population std); n <= 0: nothing."""
    alive = [x for x in logits if x != NEG_INF]
    if n <= 0 or len(alive) <= 1:
        return list(logits)
    mean = sum(alive) / len(alive)
    std = math.sqrt(sum((x - mean) ** 2 for x in alive) / len(alive))
    return [x if x >= max(alive) - n * std else NEG_INF for x in logits]


def xtc(logits: list[float], probability: float, threshold: float, chance: float) -> list[float]:
    """With chance <= probability: of the candidates with p >= threshold (a prefix of the sorted
    list), all but the last are removed, when there are at least two."""
    cands = candidates(logits)
    if probability <= 0 or threshold > 0.5 or len(cands) < 2 or chance > probability:
        return list(logits)
    last = 0
    for position, (_, _, p) in enumerate(cands):
        if p >= threshold:
            last = position
        else:
            break
    if last == 0:
        return list(logits)
    return keep(logits, [i for i, _, _ in cands[last:]])


def typical(logits: list[float], mass: float) -> list[float]:
    """Sort by |-log p - entropy| (ascending, stable over the sorted candidates), keep until the
    running sum of p first exceeds mass."""
    cands = candidates(logits)
    if mass >= 1:
        return list(logits)
    entropy = -sum(p * math.log(p) for _, _, p in cands if p > 0)
    ranked = sorted(cands, key=lambda c: abs(-math.log(c[2]) - entropy) if c[2] > 0 else math.inf)
    kept, total = [], 0.0
    for i, _, p in ranked:
        kept.append(i)
        total += p
        if total > mass:
            break
    return keep(logits, kept)


def dynamic_temperature(logits: list[float], temp: float, delta: float, exponent: float) -> list[float]:
    """temp_ext: with delta > 0 the temperature is min + (max - min) * (H / log n) ** exponent over
    the n candidates (one candidate: unchanged); a temperature <= 0 keeps the top token alone."""
    if delta <= 0:
        return [x / temp for x in logits]
    cands = candidates(logits)
    if len(cands) <= 1:
        return list(logits)
    low, high = max(0.0, temp - delta), temp + delta
    entropy = -sum(p * math.log(p) for _, _, p in cands if p > 0)
    t = low + (high - low) * (entropy / math.log(len(cands))) ** exponent
    if t <= 0:
        return keep(logits, [cands[0][0]])
    return [x / t for x in logits]


def mirostat_v1(logits: list[float], mu: float, tau: float, eta: float, n_vocab: int, u: float,
                m: int = 100) -> tuple[int, float, list[float]]:
    """One step: s_hat from the top m, k, keep the top k, draw with u, mu -= eta * (surprise - tau).
    Returns (token, new mu, the kept logits)."""
    cands = candidates(logits)
    sum_tb = sum_tt = 0.0
    for i in range(min(m - 1, len(cands) - 1)):
        t = math.log((i + 2) / (i + 1))
        b = math.log(cands[i][2] / cands[i + 1][2])
        sum_tb += t * b
        sum_tt += t * t
    s_hat = sum_tb / sum_tt
    epsilon = s_hat - 1
    k = ((epsilon * 2**mu) / (1 - n_vocab ** (-epsilon))) ** (1 / s_hat)
    kept = keep(logits, [i for i, _, _ in cands[: max(int(k), 1)]])
    return _mirostat_draw(kept, mu, tau, eta, u)


def mirostat_v2(logits: list[float], mu: float, tau: float, eta: float, u: float) -> tuple[int, float, list[float]]:
    """One step: keep the sorted prefix whose surprise -log2 p is at most mu (at least one), draw with
    u, mu -= eta * (surprise - tau)."""
    cands = candidates(logits)
    prefix = []
    for i, _, p in cands:
        if -math.log2(p) > mu:
            break
        prefix.append(i)
    kept = keep(logits, prefix or [cands[0][0]])
    return _mirostat_draw(kept, mu, tau, eta, u)


def _mirostat_draw(kept: list[float], mu: float, tau: float, eta: float, u: float) -> tuple[int, float, list[float]]:
    token = pick(kept, u)
    p = dict((i, p) for i, _, p in candidates(kept))[token]
    return token, mu - eta * (-math.log2(p) - tau), kept


def dry(logits: list[float], context: list[int], multiplier: float, base: float, allowed: int, last_n: int,
        breakers: dict[int, list[tuple[int, ...]]]) -> list[float]:
    """DRY as its rules read. Within the last last_n tokens of the context (-1: all): a repetition may
    not reach back past the end of the nearest sequence breaker (a head token and the tail that
    follows it). For every earlier position j, the longest n such that the n tokens ending at j equal
    the last n tokens (at most that limit): when n >= allowed, the token after j would extend a
    repeat of length n, and its logit loses multiplier * base ** (n - allowed) for the longest such
    n, unless that token is itself a one-token breaker."""
    window = context[-last_n:] if last_n > 0 else list(context)
    size = len(window)
    out = list(logits)
    if multiplier == 0 or base < 1 or last_n == 0 or size <= allowed:
        return out
    limit = size
    for back in range(size):  # the nearest breaker, scanning from the end
        head = size - 1 - back
        lengths = [len(t) for t in breakers.get(window[head], []) if len(t) <= back
                   and all(window[head + 1 + o] == t[o] for o in range(len(t)))]
        if lengths:
            limit = back - max(lengths)
            break
    if limit < allowed:
        return out
    longest: dict[int, int] = {}
    for j in range(size - 1):
        n = 0
        while n <= j and window[j - n] == window[size - 1 - n]:
            n += 1
        n = min(n, limit)
        if n >= allowed:
            token = window[j + 1]
            longest[token] = max(longest.get(token, 0), n)
    cap = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for token, n in longest.items():
        if () in breakers.get(token, []):
            continue
        exponent = n - allowed if not cap or n - allowed <= cap else cap
        out[token] = logits[token] - multiplier * base**exponent
    return out


def breaker_sequences(words: list[bytes], breaker: bytes, tokenize, max_tail: int = 20) -> dict[int, list[tuple]]:
    """llama.cpp's get_overlapping_token_sequences over a whole vocabulary: a token whose text holds
    the breaker is a one-token breaker (tail ()); a token whose text ends with the breaker's first
    i bytes (i < its length) heads a sequence whose tail is the tokenization of the rest."""
    found: dict[int, list[tuple]] = {}
    for token, word in enumerate(words):
        if breaker in word:
            found.setdefault(token, []).append(())
            continue
        for position in range(len(word)):
            if word[position] != breaker[0]:
                continue
            rest = word[position:]
            if breaker.startswith(rest):
                tail = tuple(tokenize(breaker[len(rest):])[:max_tail])
                if tail not in found.get(token, []):
                    found.setdefault(token, []).append(tail)
    return found
