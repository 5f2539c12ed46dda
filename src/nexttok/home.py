"""Where nexttok keeps what it makes once and reuses: the cache (built kernels, parsed GGUF
indexes, joined model files, torch.compile's artifacts), and the models `nexttok pull` stores. The
lowest module: anything may use it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """$NEXTTOK_HOME, else $XDG_CACHE_HOME/nexttok, else ~/.cache/nexttok."""
    if os.environ.get("NEXTTOK_HOME"):
        return Path(os.environ["NEXTTOK_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nexttok"


def models_home() -> Path:
    """Where pulled models are stored: $NEXTTOK_MODELS, else the cache's models/ folder."""
    if os.environ.get("NEXTTOK_MODELS"):
        return Path(os.environ["NEXTTOK_MODELS"])
    return cache_home() / "models"
