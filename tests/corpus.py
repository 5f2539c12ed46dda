"""A varied test/benchmark text built offline from the standard library and a seeded RNG.

English prose (pydoc topics), Python code, numbers, whitespace runs, emoji, CJK and other
scripts, accents (composed and decomposed), contractions and special tokens.
"""

from __future__ import annotations

import inspect
import json
import random
import textwrap
import unicodedata
from functools import lru_cache

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _prose(limit: int) -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics.values())[:limit]


def _code(limit: int) -> str:
    return "\n".join(inspect.getsource(m) for m in (json.decoder, textwrap, random))[:limit]


def _pick(rng: random.Random, lo: int, hi: int, n: int) -> str:
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def _numbers(rng: random.Random, n: int) -> str:
    forms = [
        lambda: str(rng.randint(0, 10**rng.randint(1, 12))),
        lambda: f"{rng.uniform(-1e6, 1e6):,.{rng.randint(0, 6)}f}",
        lambda: f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        lambda: f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(0, 9999):04d}",
        lambda: f"{rng.random():.3e}",
        lambda: f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}",
    ]
    return " ".join(rng.choice(forms)() for _ in range(n))


def _whitespace(rng: random.Random, n: int) -> str:
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", " \n ", "\t\t  ", "\u2028"]
    words = ["alpha", "beta", "x", "if", "(", ")", "{", "}", "42", "é"]
    return "".join(rng.choice(words) + rng.choice(spaces) * rng.randint(1, 4) for _ in range(n))


def _scripts(rng: random.Random, n: int) -> str:
    ranges = [
        (0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3),  # CJK, kana, Hangul
        (0x0400, 0x04FF), (0x0370, 0x03FF), (0x0600, 0x06FF), (0x0900, 0x097F),  # Cyrillic .. Devanagari
        (0x0E00, 0x0E7F), (0x05D0, 0x05EA),  # Thai, Hebrew
    ]
    sentences = ["日本語のテキストです。", "中文文本，包括标点符号！", "한국어 텍스트입니다.",
                 "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया"]
    return " ".join(rng.choice(sentences) if rng.random() < 0.2
                    else _pick(rng, *rng.choice(ranges), rng.randint(1, 8)) for _ in range(n))


def _emoji(rng: random.Random, n: int) -> str:
    base = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F680, 0x1F6FF, 0x1F900, 0x1F9FF]
    out = []
    for _ in range(n):
        i = rng.randrange(0, len(base), 2)
        e = _pick(rng, base[i], base[i + 1], 1)
        if rng.random() < 0.2:
            e += chr(rng.randint(0x1F3FB, 0x1F3FF))  # skin tone
        if rng.random() < 0.2:
            e += "\u200d" + _pick(rng, 0x1F466, 0x1F469, 1)  # ZWJ sequence
        out.append(e + rng.choice(["", " ", "!", "\n"]))
    return "".join(out)


def _accents(rng: random.Random, n: int) -> str:
    words = ["café", "naïve", "façade", "Übermäßig", "Đặng Thị Ngọc", "señor", "Ærøskøbing",
             "crème brûlée", "São Paulo", "Łódź", "İstanbul", "Straße", "ﬁnance"]
    return " ".join(unicodedata.normalize(rng.choice(["NFC", "NFD"]), rng.choice(words))
                    for _ in range(n))


def _contractions_and_specials(rng: random.Random, n: int) -> str:
    pieces = ["I'll", "don't", "WE'RE", "she'S", "you've", "it'd", "'m", "''", "rock'n'roll",
              *SPECIAL_TOKENS, "<|endoftext|><|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n",
              "<|notspecial|>", "<|endof", "text|>"]
    return " ".join(rng.choice(pieces) for _ in range(n))


@lru_cache(maxsize=1)
def corpus() -> str:
    """About 320 KB: 150 KB prose, 60 KB code, and generated mixed-script text."""
    rng = random.Random(1234)
    parts = [
        _prose(150_000), _code(60_000), _numbers(rng, 3000), _whitespace(rng, 3000),
        _scripts(rng, 2500), _emoji(rng, 2500), _accents(rng, 2000),
        _contractions_and_specials(rng, 2000),
    ]
    return "\n".join(parts)


def chunks(text: str, size: int = 2000) -> list[str]:
    """Fixed-size slices (they cut words, whitespace runs and specials in arbitrary places)."""
    return [text[i : i + size] for i in range(0, len(text), size)]
