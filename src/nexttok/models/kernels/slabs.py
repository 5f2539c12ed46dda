"""Where repacked weights live: 2 MiB pages, asked for by madvise, under slabs of memory aligned to them.

A decode step streams every weight once from memory, and on 4 KiB pages that is a TLB miss every
4 KiB (a 175 MB output layer, Q4_0, 2 threads, AMD EPYC: 22.4 -> 25.6 GB/s on 2 MiB pages). Linux
backs with 2 MiB pages only the whole 2 MiB runs it is advised of; a weight allocated alone kept up to
2 MiB at each end on 4 KiB pages, which for the Qwen2.5-1.5B-shaped Q4_K_M file was ~40% of the
q/k/v, o and down_proj bytes (a 1.3 MB o_proj had no whole run at all). So `tile_memory` cuts every
weight's tiles from slabs that start on a 2 MiB boundary, one after another: all of a weight is on 2
MiB pages, and a slab's unused end is never written, so it costs no memory. Decoding that file read
the q/k/v at ~41 GB/s instead of ~34, the down_proj at ~47 instead of ~41, in the fast memory state
of a Zen 4 VM (2 threads); the whole step 1.059x (1.009-1.143) over 30 such pairs of 32 tokens.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import weakref

import torch

HUGE_PAGE = 1 << 21
SLAB = 64 << 20  # a slab's size, or a weight's rounded up to whole 2 MiB pages where it is larger
ALIGN = 64  # each weight's first byte on a cache line


def huge_pages(tensor: torch.Tensor) -> None:
    """Ask Linux for 2 MiB pages under a tensor's whole 2 MiB runs (madvise MADV_HUGEPAGE; where
    transparent huge pages are "madvise", as here, nothing gets them unasked). Nothing where the
    system has no such call."""
    start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    end = (start + size) // HUGE_PAGE * HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if end > first and advice is not None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), advice)


class _Slab:
    """An allocation of `size` bytes from a 2 MiB boundary on, filled from the front. Held weakly: it
    goes when the last weight cut from it goes (each cut is a view, which holds its base)."""

    def __init__(self, size: int) -> None:
        base = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
        self.start = (-base.data_ptr()) % HUGE_PAGE
        self.size, self.used, self.base = size, 0, weakref.ref(base)
        huge_pages(base[self.start:self.start + size])
        self._hold = base  # until its first cut is made

    def cut(self, nbytes: int) -> torch.Tensor | None:
        base = self.base() if self._hold is None else self._hold
        if base is None or self.used + nbytes > self.size:
            return None
        out = base[self.start + self.used:self.start + self.used + nbytes]
        self.used += (nbytes + ALIGN - 1) // ALIGN * ALIGN
        self._hold = None
        return out


_slabs: list[_Slab] = []
_lock = threading.Lock()


def tile_memory(nbytes: int) -> torch.Tensor:
    """nbytes of uint8 (uninitialised) on 2 MiB pages, from the first slab with room (or a new one)."""
    with _lock:
        _slabs[:] = [slab for slab in _slabs if slab._hold is not None or slab.base() is not None]
        for slab in _slabs:
            if (out := slab.cut(nbytes)) is not None:
                return out
        slab = _Slab(max(SLAB, (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE))
        _slabs.append(slab)
        return slab.cut(nbytes)
