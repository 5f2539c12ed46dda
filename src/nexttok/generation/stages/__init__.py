"""The sampler chain's stages, each described once by a StageSpec (spec.py): its settings with their
bounds and defaults, what it needs, when people use it, how to build it. SamplingParams, the
server's request fields, the CLI flags of `run` and `chat`, the page's dials and the trace's
sampling record are all made from STAGES, so adding a stage is a class and an entry here.

STAGES is also the default order (llama.cpp's: penalties, then the filters, temperature last; a
stage marked `last` runs after the ordered ones, just before the draw). SETTINGS maps every
setting's name (llama-server's, where it has the setting) to its bound; `spec_of` finds the stage
that owns one, for a table of another API's names (Ollama's options, say) onto these.
"""

from nexttok.generation.stages.dry import DRY, DRY_SPEC, TextBreakers, TokenBreakers
from nexttok.generation.stages.filters import (
    MIN_P,
    TOP_K,
    TOP_N_SIGMA,
    TOP_P,
    TYPICAL_P,
    XTC,
    XTC_SPEC,
    MinP,
    TopK,
    TopNSigma,
    TopP,
    TypicalP,
)
from nexttok.generation.stages.penalties import LOGIT_BIAS, PENALTIES, History, LogitBias, Penalties, check_token_ids
from nexttok.generation.stages.spec import (
    GREEDY_BELOW,
    NEG_INF,
    Bound,
    ChainContext,
    Random,
    Setting,
    Stage,
    StageSpec,
    Stateless,
    Strings,
    TokenBiases,
    Uniforms,
)
from nexttok.generation.stages.temperature import MIROSTAT, TEMPERATURE, Mirostat, Temperature

STAGES: tuple[StageSpec, ...] = (PENALTIES, DRY_SPEC, LOGIT_BIAS, TOP_N_SIGMA, TOP_K, TYPICAL_P, TOP_P, MIN_P, XTC_SPEC,
                                 TEMPERATURE, MIROSTAT)
ORDERED = {spec.name: spec for spec in STAGES if not spec.last}  # the stages `order` arranges
STAGE_NAMES = tuple(ORDERED)
DEFAULT_ORDER = STAGE_NAMES
SETTINGS: dict[str, Setting] = {name: setting for spec in STAGES for name, setting in spec.settings.items()}
SEED = Bound(None, 0, 2**63, "same seed, same draws; none: a fresh one", integer=True, high_open=True)
ON_KEPT = frozenset(spec.name for spec in STAGES if spec.on_kept)  # may run on top-k's kept logits alone
REWEIGHTS = frozenset(spec.name for spec in STAGES if spec.reweights)  # change chosen tokens' values


def spec_of(setting: str) -> StageSpec:
    """The stage a setting belongs to: spec_of("min_p").name == "min_p"."""
    return next(spec for spec in STAGES if setting in spec.settings)


__all__ = [
    "DEFAULT_ORDER", "GREEDY_BELOW", "NEG_INF", "ON_KEPT", "ORDERED", "REWEIGHTS", "SEED", "SETTINGS", "STAGES",
    "STAGE_NAMES", "DRY", "XTC", "Bound", "ChainContext", "History", "LogitBias", "MinP", "Mirostat", "Penalties",
    "Random", "Setting", "Stage", "StageSpec", "Stateless", "Strings", "Temperature", "TextBreakers", "TokenBiases",
    "TokenBreakers", "TopK", "TopNSigma", "TopP", "TypicalP", "Uniforms", "check_token_ids", "spec_of",
]
