"""Grammar → token-mask libraries side by side on the default model's vocabulary (49,152 tokens),
then nexttok's grammar stage on the default model itself.

    .venv/bin/python bench/grammar.py [--repeat 3]        libraries (pip install xgrammar outlines-core
                                                           to compare; llguidance is nexttok's)
    .venv/bin/python bench/grammar.py --overhead          decode step with vs without the stage
    .venv/bin/python bench/grammar.py --validate          20 schemas through the openai client

For each library (llguidance, xgrammar, outlines-core) and each JSON schema of a small set: the time
to build its view of the vocabulary, to compile the schema, and per generated token the time to
compute the allowed-token mask and to advance the matcher by the token, walking the tokens of a
document that fits the schema (our tokenizer's ids). Medians over the tokens, then over repeats.
A decode step of the default model takes ~18 ms here (nexttok bench): the goal is a mask ≤ 10% of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.checkpoints.sources import load_tokenizer

SCHEMAS = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}, {"name": "Ada Lovelace", "age": 36}),
    ({"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
        "temperatures": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 5},
        "sunny": {"type": "boolean"}}, "required": ["city", "temperatures", "sunny"]},
     {"city": "Paris", "temperatures": [12.5, 14, 9.75], "sunny": True}),
    ({"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                         "qty": {"type": "integer", "minimum": 1}},
        "required": ["sku", "qty"]}}}, "required": ["items"]},
     {"items": [{"sku": "ABC-1234", "qty": 2}, {"sku": "XYZ-0001", "qty": 10}]}),
]


def vocabulary(tokenizer) -> list[bytes]:
    return [tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)]


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, tokens: list[bytes], eos: int):
        import llguidance
        import llguidance.torch

        class Wrapped:
            eos_token_id, bos_token_id = eos, None
            special_token_ids = sorted(tokenizer.special_ids)

            def __call__(self, s):
                return tokenizer.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s,
                                        allow_special=False)
        Wrapped.tokens = tokens
        self.llg, self.fill = llguidance, llguidance.torch.fill_next_token_bitmask
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()))
        self.mask = llguidance.torch.allocate_token_bitmask(1, len(tokens))

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def step(self, matcher, token):
        self.fill(matcher, self.mask, 0)
        assert (self.mask[0, token // 32] >> (token % 32)) & 1, "the document's token is masked"
        assert matcher.consume_token(token), matcher.get_error()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, tokens: list[bytes], eos: int):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(tokens, vocab_type=xgrammar.VocabType.RAW, vocab_size=len(tokens),
                                      stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2)
        self.mask = xgrammar.allocate_token_bitmask(1, len(tokens))

    def compile(self, schema):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def step(self, matcher, token):
        matcher.fill_next_token_bitmask(self.mask)
        assert (self.mask[0, token // 32] >> (token % 32)) & 1, "the document's token is masked"
        assert matcher.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, tokens: list[bytes], eos: int):
        import outlines_core

        self.oc = outlines_core
        table: dict[bytes, list[int]] = {}
        for i, b in enumerate(tokens):
            if i != eos and i not in tokenizer.special_ids:
                table.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, table)
        self.mask = torch.zeros(1, (len(tokens) + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def step(self, guide, token):
        guide.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())
        assert (self.mask[0, token // 32] >> (token % 32)) & 1, "the document's token is masked"
        guide.advance(token)


def measure(engine, tokenizer, schema, document) -> tuple[float, float]:
    """(compile seconds, median seconds per token of mask + advance)."""
    ids = tokenizer.encode(json.dumps(document), allow_special=False)
    start = time.perf_counter()
    matcher = engine.compile(schema)
    compiled = time.perf_counter() - start
    times = []
    for token in ids:
        start = time.perf_counter()
        engine.step(matcher, token)
        times.append(time.perf_counter() - start)
    return compiled, statistics.median(times)


def overhead(repeat: int) -> None:
    """Median decode step of the default model with and without a JSON-schema grammar stage,
    interleaved (the machine is shared: one process, alternating runs)."""
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.grammar import Constraint
    from nexttok.generation.loop import stream
    from nexttok.generation.sampling import SamplingParams

    checkpoint = load_checkpoint(DEFAULT_MODEL)
    model, tokenizer, config = checkpoint.model, checkpoint.tokenizer, checkpoint.model.config
    prompt = checkpoint.chat_template.render([{"role": "user", "content": "Describe a scientist as JSON."}])
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "field": {"type": "string"},
                                               "born": {"type": "integer"}, "awards": {"type": "array",
                                                                                      "items": {"type": "string"}}}}
    medians: dict[str, list[float]] = {"plain": [], "grammar": []}
    for _ in range(repeat):
        for kind in medians:
            constraint = (Constraint.json_schema(tokenizer, config.vocab_size, schema, config.eos_token_id)
                          if kind == "grammar" else None)
            steps = list(stream(model, tokenizer, prompt, SamplingParams(temperature=0.7, seed=1), max_tokens=64,
                                stop_token_ids=[] if constraint is None else None, constraint=constraint))
            medians[kind].append(statistics.median(s.elapsed for s in steps[1:]) * 1000)
    plain, grammar = statistics.median(medians["plain"]), statistics.median(medians["grammar"])
    print(f"decode step, median of {repeat} runs (ms): plain {plain:.2f} {_range(medians['plain'])}, "
          f"grammar {grammar:.2f} {_range(medians['grammar'])}; overhead {100 * (grammar / plain - 1):+.1f}%")


def _range(values: list[float]) -> str:
    return f"[{min(values):.2f}-{max(values):.2f}]"


def validate(temperature: float) -> None:
    """The 20 schemas of tests/json_schemas.py on the default model through the official openai
    client against an in-process server: how many outputs parse and validate (jsonschema)."""
    import jsonschema
    import openai

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from json_schemas import SCHEMAS
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    served = load_served(DEFAULT_MODEL)
    good = 0
    with LiveServer(create_app([served])) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        for seed, (name, prompt, schema) in enumerate(SCHEMAS):
            done = client.chat.completions.create(
                model=served.name, messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
                temperature=temperature, seed=seed, max_tokens=400,
                response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
            text = done.choices[0].message.content
            try:
                jsonschema.validate(json.loads(text), schema)
                good += 1
                verdict = "ok"
            except (ValueError, jsonschema.ValidationError) as e:
                verdict = f"INVALID ({type(e).__name__})"
            print(f"{name:<12} {verdict:<10} {done.choices[0].finish_reason:<6} {text[:100]}")
    print(f"{good}/{len(SCHEMAS)} outputs parse and validate (temperature {temperature})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--overhead", action="store_true", help="decode step with vs without the grammar stage")
    parser.add_argument("--validate", action="store_true", help="20 schemas through the openai client")
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.overhead:
        return overhead(args.repeat)
    if args.validate:
        return validate(args.temperature)
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    tokens, eos = vocabulary(tokenizer), 0
    print(f"vocabulary: {len(tokens)} tokens ({DEFAULT_MODEL})")
    print(f"{'library':<14} {'vocab s':>8} {'compile ms (per schema)':>26} {'mask+advance µs/token':>24}")
    for cls in (LLGuidance, XGrammar, OutlinesCore):
        try:
            start = time.perf_counter()
            engine = cls(tokenizer, tokens, eos)
            built = time.perf_counter() - start
            runs = [[measure(engine, tokenizer, s, d) for s, d in SCHEMAS] for _ in range(args.repeat)]
        except ImportError:
            print(f"{cls.name:<14} not installed (pip install {cls.name})")
            continue
        except Exception as e:  # a library that cannot run this vocabulary is reported, not fatal
            print(f"{cls.name:<14} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        compiles = [statistics.median(r[i][0] for r in runs) * 1000 for i in range(len(SCHEMAS))]
        steps = [statistics.median(r[i][1] for r in runs) * 1e6 for i in range(len(SCHEMAS))]
        print(f"{cls.name:<14} {built:>8.2f} {' / '.join(f'{c:.0f}' for c in compiles):>26} "
              f"{' / '.join(f'{s:.0f}' for s in steps):>24}")


if __name__ == "__main__":
    main()
