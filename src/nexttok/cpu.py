"""The CPU's feature flags as Linux lists them in /proc/cpuinfo, for what describes or picks an
instruction set (kernels.describe, bench/kernels_ab.py). No torch here: a bench script asks without
importing it."""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    """{"avx2", "fma", ...} of the first CPU listed; empty where /proc/cpuinfo cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
