"""What a stage is, and how it describes itself once.

A stage (llama.cpp's llama_sampler) has a `name`, `apply(logits) -> logits` over (vocab,),
`accept(token_id)` (the token chosen after it: stateful stages remember it), `reset()` (back to
the state it was built in) and `clone(uniforms)` (an independent copy of it, its state included,
that takes its random numbers from `uniforms`).

A StageSpec describes one: its name, its settings (each a field of SamplingParams, of the OpenAI
request under llama-server's name, a flag of `nexttok run` and `nexttok chat`, a dial of the page
when it is a number, and a property of a trace's sampling record), whether it may run on top-k's
kept candidates alone, whether it runs when the chain is greedy (it can change the most likely
token), what it needs from the generation (the token history, the tokenizer, random numbers from
the draw's seeded stream), when people use it, and how to build it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nexttok.errors import InvalidParameter

NEG_INF = float("-inf")
GREEDY_BELOW = 1e-5  # temperatures this small draw greedily (as vLLM): dividing by them overflows


@dataclass(frozen=True)
class Bound:
    """A number setting: its neutral default, the values it takes and what it does."""

    default: float | int | None
    low: float
    high: float
    meaning: str
    integer: bool = False
    low_open: bool = False
    high_open: bool = False
    dial_high: float | None = None  # where a dial ends when `high` is far beyond anything useful

    def allowed(self) -> str:
        """In words: Bound(1.0, 0, 1, "", low_open=True).allowed() == "in (0, 1]"."""
        kind = "an integer" if self.integer else "a number"
        if self.high == math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {_number(self.low)}"
        interval = (f"{'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
                    f"{')' if self.high_open else ']'}")
        return f"{kind} in {interval}" if self.integer else f"in {interval}"

    def allows(self, value) -> bool:
        if self.integer:
            if type(value) is not int:
                return False
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False  # NaN and ±inf too: an infinite temperature turns every logit into NaN
        above = value > self.low if self.low_open else value >= self.low
        return above and (value < self.high if self.high_open else value <= self.high)

    def check(self, name: str, value) -> None:
        """Raise InvalidParameter naming the parameter when value is outside the bound."""
        if not self.allows(value):
            raise InvalidParameter(name.split("[")[0], f"{name} must be {self.allowed()}, got {value!r}")

    def limits(self) -> dict[str, float]:
        """As pydantic Field keywords: the bound of top_p gives {"gt": 0.0, "le": 1.0}."""
        found = {"gt" if self.low_open else "ge": self.low}
        if self.high != math.inf:
            found["lt" if self.high_open else "le"] = self.high
        return found

    def as_json(self) -> dict:
        return {**dataclasses.asdict(self), "high": None if self.high == math.inf else self.high}

    def schema(self) -> dict:
        """JSON Schema: Bound(0, 0, 1, "").schema() == {"type": "number", "minimum": 0, "maximum": 1}."""
        keys = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
        return {"type": "integer" if self.integer else "number",
                **{keys[k]: v for k, v in self.limits().items()}}

    @property
    def annotation(self) -> type:
        return int if self.integer else float

    def fresh(self):
        return self.default

    def to_json(self, value):
        return value

    def from_json(self, value):
        return value


def _number(x: float) -> str:
    """_number(2.0) == "2"; _number(2**63) == "2**63"."""
    if isinstance(x, int) and x >= 2**32 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:g}"


@dataclass(frozen=True)
class Strings:
    """A list of strings (DRY's sequence breakers); on the command line, one flag per string."""

    default: tuple[str, ...]
    meaning: str
    flag: str  # the repeatable flag of one string
    max_items: int = 16
    max_length: int = 40

    def check(self, name: str, value) -> None:
        """Strings(("a",), "", "x").check("s", ["", "b"]) raises: 's[0] must be 1 to 40 characters ...'."""
        if not isinstance(value, (list, tuple)) or len(value) > self.max_items:
            raise InvalidParameter(name, f"{name} must be a list of at most {self.max_items} strings, got {value!r}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not 1 <= len(item) <= self.max_length:
                raise InvalidParameter(name, f"{name}[{i}] must be 1 to {self.max_length} characters, got {item!r}")

    def schema(self) -> dict:
        return {"type": "array", "maxItems": self.max_items,
                "items": {"type": "string", "minLength": 1, "maxLength": self.max_length}}

    def as_json(self) -> dict:
        return {"default": list(self.default), "meaning": self.meaning, "max_items": self.max_items,
                "max_length": self.max_length}

    annotation = list[str]

    def fresh(self) -> list[str]:
        return list(self.default)

    def to_json(self, value) -> list[str]:
        return list(value)

    def from_json(self, value) -> list[str]:
        return list(value)


@dataclass(frozen=True)
class TokenBiases:
    """A mapping of token id to a number added to its logit (logit_bias); JSON keys are strings."""

    bias: Bound
    meaning: str

    def check(self, name: str, value) -> None:
        if not isinstance(value, Mapping):
            raise InvalidParameter(name, f"{name} must be a mapping of token id to bias")
        for token, bias in value.items():
            if type(token) is not int or token < 0:
                raise InvalidParameter(name, f"{name} keys must be token ids (integers >= 0), got {token!r}")
            self.bias.check(f"{name}[{token}]", bias)

    def schema(self) -> dict:
        return {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": self.bias.schema()}

    def as_json(self) -> dict:
        return {"default": {}, "meaning": self.meaning, "bias": self.bias.as_json()}

    annotation = dict[int, float]

    def fresh(self) -> dict:
        return {}

    def to_json(self, value) -> dict[str, float]:
        return {str(k): v for k, v in value.items()}

    def from_json(self, value) -> dict[int, float]:
        return {int(k): v for k, v in value.items()}


Setting = Bound | Strings | TokenBiases


class Random(Protocol):
    """Uniform numbers in [0, 1): the draw's seeded stream. `purpose` names the use ("draw", "xtc"):
    a stream that replays stored numbers (the explainer's node) hands each use its own."""

    def next(self, purpose: str = "draw") -> float: ...


class Uniforms:
    """The seeded stream of uniform numbers in [0, 1) that a chain takes: one per draw, and one per
    step for each stage that needs chance (XTC). Two streams with one seed give the same numbers
    (None: seeded from the OS). It lives on the CPU whatever the model's device, so a seed gives
    the same draws on every device."""

    def __init__(self, seed: int | None):
        self.seed = seed
        self.generator = torch.Generator()
        self.reset()

    def next(self, purpose: str = "draw") -> float:
        return float(torch.rand((), generator=self.generator))

    def reset(self) -> None:
        """Back to the start of the seed's stream (a fresh one when unseeded)."""
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)

    def clone(self) -> Uniforms:
        """An independent stream that goes on from where this one is."""
        copy = Uniforms(self.seed)
        copy.generator.set_state(self.generator.get_state())
        return copy


@dataclass
class ChainContext:
    """What a stage may take from the generation it samples for (its StageSpec.needs says which):
    the prompt (the history starts with it), the tokenizer, and the draw's random stream."""

    vocab_size: int
    prompt_ids: Sequence[int] = ()
    device: Any = "cpu"
    tokenizer: Any = None  # a nexttok Tokenizer
    uniforms: Random | None = None


class Stage(Protocol):
    """One step of the chain (llama.cpp's llama_sampler: name, apply, accept, reset, clone)."""

    name: str

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (vocab,) -> logits (vocab,)."""

    def accept(self, token_id: int) -> None:
        """The token chosen after this step: stateful stages remember it."""

    def reset(self) -> None:
        """Back to the state the stage was built in (its history: the prompt only)."""

    def clone(self, uniforms: Random | None) -> Stage:
        """An independent copy, state included, drawing its chance (if any) from uniforms."""


class Stateless:
    """A stage whose result depends on the logits alone: nothing to remember, one copy serves all."""

    name = "stateless"

    def accept(self, token_id: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self, uniforms: Random | None) -> Stateless:
        return self


NEEDS = ("history", "tokenizer", "random")


@dataclass(frozen=True)
class StageSpec:
    """One stage, described once (see the module's docstring). `active(params)`: the settings are
    not neutral (only active stages are built); `build(params, context)`: the stage."""

    name: str
    settings: Mapping[str, Setting]
    use: str  # when people use it, for the page
    active: Callable[[Any], bool]
    build: Callable[[Any, ChainContext], Stage]
    on_kept: bool = False  # may run on top-k's kept logits alone (a softmax-only or rescaling stage)
    greedy: bool = False  # runs in a greedy chain too: it can change which token is the most likely
    needs: frozenset[str] = frozenset()
    reweights: bool = False  # changes chosen tokens' values (penalties): the page shows by how much
    last: bool = False  # not in `order`: it runs last, just before the draw (Mirostat)
    alone_with: tuple[str, ...] | None = None  # when it runs, only these other stages do (Mirostat)

    def __post_init__(self) -> None:
        assert self.needs <= set(NEEDS), self.needs
