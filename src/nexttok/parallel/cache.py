"""KV caches kept in step across the ranks of a tensor-parallel model.

Rank 0 owns the caches the engine makes (generate_step's KVCache, the server's SlotCache); every
other rank keeps a replica of each over its own KV heads, changed exactly as rank 0's:

    a forward pass          changes every rank's the same way (same ids, same positions)
    a KVCache rank 0 is     its length and contiguous flag, synced before each call (all that
    handed                  truncate / reset change besides the slots a pass writes)
    a Mirrored cache        every method call but a forward pass's own (claim, release, row,
                            running_view, release_scratch, ...), logged and replayed in order

The log travels with the next call. Caches are named by small integers; when rank 0's is garbage
collected, the replicas are dropped. Arguments of logged calls must be plain values (ints, lists):
a tensor of keys or values (a prefix cache's copy into a slot) is rank 0's heads only, so such a
call is refused rather than replayed wrong.
"""

from __future__ import annotations

import collections
import itertools
import weakref

import torch

from nexttok.models.cache import KVCache
from nexttok.models.slot_cache import SlotCache

FORWARD = frozenset({"append_positions", "update_and_fetch"})  # what a forward pass calls (not logged)


class CacheLog:
    """Rank 0's side: names its caches and logs what changes them outside forward passes."""

    def __init__(self):
        self.ops: collections.deque = collections.deque()  # appended from any thread (finalizers too)
        self._keys: dict[int, int] = {}  # id() of a KVCache handed in -> its name
        self._names = itertools.count()

    def mirrored(self, cache: SlotCache | KVCache) -> Mirrored:
        """The cache, logged: pass this one to the model and to whatever changes the cache."""
        if not isinstance(cache, (SlotCache, KVCache)):
            raise ValueError(f"tensor parallelism keeps KVCache and SlotCache in step, not {type(cache).__name__}")
        key = next(self._names)
        self.ops.append(("new", key, _spec(cache)))
        return self._wrap(cache, key)

    def reference(self, cache) -> tuple[object, int | None]:
        """(the cache rank 0 runs on, the name the other ranks know it by) for a forward call."""
        if cache is None:
            return None, None
        if isinstance(cache, Mirrored):
            return cache._target, cache._key
        if not isinstance(cache, KVCache):
            raise ValueError(f"a {type(cache).__name__} is not kept in step across tensor-parallel ranks: pass a "
                             "KVCache, or a cache made by TensorParallel.mirrored()")
        key = self._keys.get(id(cache))
        if key is None:
            key = self._keys[id(cache)] = next(self._names)
            self.ops.append(("new", key, _spec(cache)))
            weakref.finalize(cache, self._forget, id(cache), key)
        self.ops.append(("sync", key, cache.offset, cache.contiguous))
        return cache, key

    def drain(self) -> list:
        """The operations logged since the last call, oldest first."""
        ops = []
        while self.ops:
            ops.append(self.ops.popleft())
        return ops

    def call(self, proxy: Mirrored, name: str, method, args: tuple, kwargs: dict):
        if _holds_tensor((*args, *kwargs.values())):
            raise ValueError(f"cache.{name}() with tensors cannot be replayed on the other tensor-parallel ranks "
                             "(rank 0's keys and values hold only its own KV heads)")
        result = method(*args, **kwargs)
        key = None
        if hasattr(result, "update_and_fetch"):  # a view (row, running_view): a cache of its own
            key = next(self._names)
            result = self._wrap(result, key)
        self.ops.append(("call", proxy._key, name, args, kwargs, key))
        return result

    def _wrap(self, target, key: int) -> Mirrored:
        proxy = Mirrored(target, key, self)
        weakref.finalize(proxy, self.ops.append, ("drop", key))
        return proxy

    def _forget(self, ident: int, key: int) -> None:
        self._keys.pop(ident, None)
        self.ops.append(("drop", key))


class Mirrored:
    """A cache whose every method call but a forward pass's own is logged for the other ranks;
    attributes read through. Attributes are not set from outside (a change would go unlogged)."""

    def __init__(self, target, key: int, log: CacheLog):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name: str):
        value = getattr(self._target, name)
        if name in FORWARD or not callable(value):
            return value
        return lambda *args, **kwargs: self._log.call(self, name, value, args, kwargs)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"cannot set {name!r} on a tensor-parallel cache: change it through a method "
                             "(methods are replayed on every rank)")


class Replicas:
    """Another rank's side: its own copy of each of rank 0's caches, over this rank's KV heads."""

    def __init__(self, n_kv_heads: int, device: torch.device):
        self.n_kv_heads, self.device = n_kv_heads, device
        self.caches: dict[int, object] = {}

    def apply(self, ops: list) -> None:
        for op in ops:
            getattr(self, "_" + op[0])(*op[1:])

    def get(self, key: int | None):
        return None if key is None else self.caches[key]

    def _new(self, key: int, spec: tuple) -> None:
        kind, n_layers, rows, max_len, head_dim, dtype, windows = spec
        if kind == "slots":
            self.caches[key] = SlotCache(n_layers, rows, self.n_kv_heads, max_len, head_dim, dtype, self.device,
                                         windows=windows)
        else:
            self.caches[key] = KVCache(n_layers, rows, self.n_kv_heads, max_len, head_dim, dtype, self.device,
                                       windows=windows)

    def _sync(self, key: int, offset: int, contiguous: bool) -> None:
        cache = self.caches[key]
        if cache.offset != offset:
            cache.truncate(offset)
        cache.contiguous = contiguous

    def _call(self, key: int, name: str, args: tuple, kwargs: dict, result: int | None) -> None:
        value = getattr(self.caches[key], name)(*args, **kwargs)
        if result is not None:
            self.caches[result] = value

    def _drop(self, key: int) -> None:
        self.caches.pop(key, None)


def _holds_tensor(value) -> bool:
    """A tensor, or a list / tuple with one somewhere inside (SlotCache.load's groups of keys and values)."""
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return isinstance(value, torch.Tensor)


def _spec(cache: SlotCache | KVCache) -> tuple:
    """What a replica is built from: kind, layers, rows (batch or slots), max_len, head_dim, dtype, and
    the layers whose keys are kept for their window only (a forward pass moves each replica's window
    buffers as rank 0's)."""
    store = cache.store if isinstance(cache, SlotCache) else cache
    return ("slots" if isinstance(cache, SlotCache) else "kv", store.n_layers, store.batch, store.max_len,
            store.head_dim, store.dtype, cache.windows)
