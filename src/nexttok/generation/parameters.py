"""The sampling parameters' table: each one's range, neutral default and meaning, as the stages
describe them (nexttok.generation.stages: each StageSpec's settings).

PARAMETERS holds every number setting (and logit_bias's per-token bound, and the seed): what
SamplingParams.validate checks, what the server's request schemas take their ranges from (so
/openapi.json says what is accepted), what the page builds its dials from. DIALS names the number
settings, in the chain's order: the page has a dial for each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nexttok.errors import InvalidParameter
from nexttok.generation.stages import GREEDY_BELOW, SEED, SETTINGS, Bound, TokenBiases

# llama.cpp's default sampler settings (common/common.h): `nexttok run`'s defaults, and the bench's
# sampled decode for both engines; the library's SamplingParams defaults are neutral instead
LLAMA_CPP_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}

DIALS: tuple[str, ...] = tuple(name for name, setting in SETTINGS.items() if isinstance(setting, Bound))
PARAMETERS: dict[str, Bound] = {
    **{name: SETTINGS[name] for name in DIALS},
    **{name: setting.bias for name, setting in SETTINGS.items() if isinstance(setting, TokenBiases)},
    "seed": SEED,
}

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

__all__ = ["DIALS", "DRAFT_TOKENS_BOUND", "GREEDY_BELOW", "LLAMA_CPP_SAMPLING", "OPENAI_STOP_STRINGS", "PARAMETERS",
           "STOP_STRINGS_BOUND", "Bound"]
