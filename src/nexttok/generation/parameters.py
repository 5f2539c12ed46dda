"""The sampling parameters' table: each one's range, neutral default and meaning, as the stages
describe them (nexttok.generation.stages: each StageSpec's settings).

PARAMETERS holds every number setting (and logit_bias's per-token bound, and the seed): what
SamplingParams.validate checks, what the server's request schemas take their ranges from (so
/openapi.json says what is accepted), what the page builds its dials from. DIALS names the number
settings, in the chain's order: the page has a dial for each.
"""

from __future__ import annotations

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

__all__ = ["DIALS", "GREEDY_BELOW", "LLAMA_CPP_SAMPLING", "PARAMETERS", "Bound"]
