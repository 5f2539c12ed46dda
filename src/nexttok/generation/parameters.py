"""The sampling parameters' table: each one's range, neutral default and meaning.

One table for every face: SamplingParams.validate checks against it, the server's request schemas
take their ranges from it (so /openapi.json says what is accepted), and the explainer page builds
its dials from it. DIALS names the parameters the page has a dial for.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nexttok.errors import InvalidParameter

# llama.cpp's default sampler settings (common/common.h): `nexttok run`'s defaults, and the bench's
# sampled decode for both engines; the library's SamplingParams defaults are neutral instead
LLAMA_CPP_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
GREEDY_BELOW = 1e-5  # temperatures this small draw greedily (as vLLM): dividing by them overflows


@dataclass(frozen=True)
class Bound:
    """The values one sampling parameter takes, its neutral default and what it does."""

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


def _number(x: float) -> str:
    """_number(2.0) == "2"; _number(2**63) == "2**63"."""
    if isinstance(x, int) and x >= 2**32 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:g}"


PARAMETERS: dict[str, Bound] = {
    "temperature": Bound(1.0, 0.0, math.inf, "divides the logits: below 1 sharpens, above 1 flattens; "
                         f"0 (below {GREEDY_BELOW:g}) = greedy", dial_high=2.0),
    "top_k": Bound(0, 0, math.inf, "keep the k most likely tokens (ties with the k-th too); 0 = off",
                   integer=True, dial_high=100),
    "top_p": Bound(1.0, 0.0, 1.0, "nucleus: keep the most likely tokens whose probabilities reach p "
                   "together; 1 = off", low_open=True),
    "min_p": Bound(0.0, 0.0, 1.0, "keep tokens at least min_p times as likely as the most likely one; 0 = off"),
    "repetition_penalty": Bound(1.0, 0.0, 100.0, "HF/CTRL: divide the positive logits of tokens in the prompt "
                                "or the output by this, multiply the negative ones; 1 = off",
                                low_open=True, dial_high=2.0),
    "presence_penalty": Bound(0.0, -2.0, 2.0, "OpenAI: subtract this once from every token already "
                              "generated; 0 = off"),
    "frequency_penalty": Bound(0.0, -2.0, 2.0, "OpenAI: subtract this times how often a token was "
                               "generated; 0 = off"),
    "logit_bias": Bound(0.0, -100.0, 100.0, "added to the logit of a token id, before the filters"),
    "seed": Bound(None, 0, 2**63, "same seed, same draws; none: a fresh one", integer=True, high_open=True),
}

# The scalar settings of the sampler stages, each a number in PARAMETERS: what validate checks
# one by one and what the explainer page has a dial for (logit_bias and seed are not dials).
DIALS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")

# Speculative decoding's k (speculative.py), a setting of the run rather than of the sampler: a round
# verifies k + 1 rows in one forward pass, and a longer draft mostly buys a longer refusal
# (llama.cpp's --draft-max defaults to 16 too)
DRAFT_TOKENS_BOUND = Bound(5, 1, 16, "tokens the drafter proposes per round", integer=True)


@dataclass(frozen=True)
class StopStringsBound:
    """How many stop strings a generation takes and how long each may be. Every step looks for each
    stop string in the text held back and holds back any tail that may begin one, so the two bound
    the work per token and the text held back (a 100,000-character stop string slowed decoding 20x)."""

    count: int
    length: int

    def allowed(self) -> str:
        """StopStringsBound(4, 1000).allowed() == "at most 4 stop strings, each at most 1000 characters"."""
        return f"at most {self.count} stop strings, each at most {self.length} characters"

    def check(self, name: str, stops) -> None:
        """Raise InvalidParameter naming the field (stop, stop_sequences, --stop) when stops are
        too many or one is too long."""
        if len(stops) > self.count:
            raise InvalidParameter(name, f"{name} takes {self.allowed()}; got {len(stops)} stop strings")
        longest = max(stops, key=len, default="")
        if len(longest) > self.length:
            raise InvalidParameter(name, f"{name} takes {self.allowed()}; got one of {len(longest)} characters")


# The engine's bound, wherever stop strings enter: the library (Generation) and CLI --stop, and the
# routes' within it. Stop strings in use are a word or a marker ("\n\nUser:", "</answer>", "```"):
# 1000 characters is far past any and keeps the text held back small. llama-server and Ollama set no
# count; chat templates' stop lists (Continue's) run to a dozen: 32.
STOP_STRINGS_BOUND = StopStringsBound(count=32, length=1000)
# OpenAI's API takes up to 4 stop sequences and refuses more: its routes (`stop`) and Anthropic's
# (`stop_sequences`) keep to that, each as long as the engine allows
OPENAI_STOP_STRINGS = dataclasses.replace(STOP_STRINGS_BOUND, count=4)
