"""Repacked weights are cut from slabs aligned to 2 MiB pages (kernels/slabs.py), back to back."""

import gc

import pytest
import torch

from nexttok.models.kernels import slabs


def fresh() -> None:
    gc.collect()
    with slabs._lock:
        slabs._slabs.clear()


def test_weights_are_cut_back_to_back_from_a_slab_on_a_2_mib_boundary():
    fresh()
    first, second = slabs.tile_memory(1000), slabs.tile_memory(5000)
    assert first.dtype == torch.uint8 and first.numel() == 1000 and second.numel() == 5000
    assert first.data_ptr() % slabs.HUGE_PAGE == 0  # a new slab's first weight starts its first page
    assert second.data_ptr() == first.data_ptr() + 1024  # the next cache line on
    assert len(slabs._slabs) == 1
    first.fill_(1)
    second.fill_(2)
    assert int(first.sum()) == 1000 and int(second.sum()) == 10000  # no overlap


def test_a_weight_larger_than_a_slab_gets_its_own_whole_pages_and_small_ones_fill_the_rest():
    fresh()
    small = slabs.tile_memory(100)
    big = slabs.tile_memory(slabs.SLAB + 1)  # more than the first slab has left
    assert big.data_ptr() % slabs.HUGE_PAGE == 0 and len(slabs._slabs) == 2
    assert slabs._slabs[1].size == slabs.SLAB + slabs.HUGE_PAGE
    after = slabs.tile_memory(100)  # first fit: back in the first slab
    assert after.data_ptr() == small.data_ptr() + 128  # 100 bytes, to the next 64-byte line


def test_a_slab_goes_when_its_last_weight_goes():
    fresh()
    view = slabs.tile_memory(4096).view(64, 64)  # the cut itself is gone; its view holds the slab
    gc.collect()
    tail = slabs.tile_memory(10)
    old = slabs._slabs[0]
    assert len(slabs._slabs) == 1 and tail.data_ptr() == view.data_ptr() + 4096
    del view
    gc.collect()
    assert old.base() is not None  # the 10 bytes still hold it
    del tail
    gc.collect()
    assert old.base() is None
    slabs.tile_memory(10)
    assert slabs._slabs == [slabs._slabs[0]] and slabs._slabs[0] is not old  # dropped, a new one made


def test_repacked_tiles_lie_in_a_slab():
    from nexttok.models import kernels

    if not kernels.available():
        pytest.skip("no C++ compiler: the block kernels are not built")
    fresh()
    raw = torch.zeros(16, 18 * 8, dtype=torch.uint8)  # 16 rows of 256 Q4_0 values
    tiled = kernels.repack("Q4_0", raw, 256)
    slab = slabs._slabs[0]
    start = slab.base().data_ptr() + slab.start
    assert start <= tiled.tiles.data_ptr() < start + slab.size and tiled.tiles.is_contiguous()
