"""Software prefetch (qkern.h's tile_rows requests each weight line 2 KiB before it reads it): AVX2
and AMX always, AVX-512 VNNI only on Intel's CPUs, where it sped weights streamed from memory up and
on AMD's Zen 4 slowed them (q_vnni.cpp). The choice is CPUID's vendor, read in C++ when the library
loads; here it is checked against Linux's /proc/cpuinfo. It changes no result: the kernels'
products are tested on whichever side this CPU takes (tests/test_kernels.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexttok.models import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")


def _vendor() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id"))


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo to read the vendor from")
def test_each_isa_prefetches_as_its_unit_says_on_this_vendor():
    module = kernels.load()
    assert [module.prefetching(isa) for isa in range(4)] == [False, True, _vendor() == "GenuineIntel", True]


def test_describe_says_whether_the_chosen_kernels_prefetch():
    on = kernels.load().prefetching(kernels.best_isa())
    assert (", prefetching (CPU:" in kernels.describe()) == on
    assert kernels.describe().startswith(kernels.ISAS[kernels.best_isa()])
