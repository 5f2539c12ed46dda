"""Tensor parallelism over torch.distributed: one model's layers split over N processes (ranks),
on one machine (`--tensor-parallel N` starts them) or several (under torchrun).

Rank 0 is the engine everyone else sees: it owns the tokenizer, the sampler, the CLI's output and
the HTTP server, and its model is a TensorParallel, called like any model. Each call is first
broadcast to the other ranks (the ids, the positions, which cache, and the log of what changed the
caches since: parallel_cache.py); then every rank runs the same forward pass over its own shard
(parallel_layers.py), the collectives inside pairing up, and rank 0 gets the whole logits. The
other ranks do nothing else: follow() answers rank 0's messages until it says stop.

    rank 0:   load_parallel(source, world=N) -> Checkpoint(model=TensorParallel(...), tokenizer, ...)
    others:   the same call never returns: they follow, then exit (torchrun: every process runs
              the same command; self-started ranks run follower_main)

Messages: Load (a model to load and shard), Call (one forward pass), Unload, and parallel_group's
STOP (its heartbeats never reach follow()). Not supported with tensor parallelism (a clear error
says so): attention captures (the explainer), --compile, and any cache but a KVCache or one made
by TensorParallel.mirrored().
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import sys
from dataclasses import dataclass

import torch
from torch import nn

from nexttok.checkpoints.loading import Checkpoint, load_checkpoint, load_model
from nexttok.checkpoints.sources import open_gguf, resolve_checkpoint
from nexttok.errors import InvalidParameter
from nexttok.models.cache import KVCache
from nexttok.models.config import ModelConfig
from nexttok.models.registry import from_hf_config, read_config
from nexttok.models.slot_cache import SlotCache
from nexttok.parallel.cache import CacheLog, Mirrored, Replicas
from nexttok.parallel.group import DEFAULT_TIMEOUT, STOP, RankFailed, RankGroup, join, start
from nexttok.parallel.layers import check_world, head_split, shard_model
from nexttok.parallel.parent import orphaned

__all__ = ["RankFailed", "TensorParallel", "follow", "load_on", "load_parallel", "model_on", "start"]
_keys = itertools.count()


@dataclass
class Load:
    key: int  # the name the ranks give this model
    source: str
    dtype: str | None


@dataclass
class Call:
    key: int
    ops: list  # cache operations since the last call (parallel_cache.py)
    cache: int | None  # which cache the pass reads and extends (None: no cache)
    ids: list[list[int]]  # (B, T)
    positions: list[list[int]] | None  # (B, T), or None: continue after what the cache holds
    last_only: bool


@dataclass
class Unload:
    key: int


class TensorParallel(nn.Module):
    """Rank 0's model: forward(ids, cache, positions) -> logits (B, T, vocab), as the model it
    shards, each call run by every rank together. `config` is the model's, with this rank's
    attention and KV heads (what its KV caches hold); vocab_size and the rest are the whole model's."""

    def __init__(self, shard: nn.Module, key: int, group: RankGroup):
        super().__init__()
        self.shard, self.key, self.group = shard, key, group
        config = shard.config
        heads = head_split(config.num_attention_heads, config.num_key_value_heads, group.rank, group.world)
        self.config = dataclasses.replace(config, num_attention_heads=len(heads.q), num_key_value_heads=len(heads.kv))
        self.POSITIONS = shard.POSITIONS
        self.compiled = None
        self.log = CacheLog()

    def forward(self, ids: torch.Tensor, cache=None, positions: torch.Tensor | None = None, *,
                capture=None, last_only: bool = False) -> torch.Tensor:
        if capture is not None:
            raise ValueError("attention captures (the explainer) are not available with --tensor-parallel")
        with self.group.talking():
            local, name = self.log.reference(cache)
            self.group.send(Call(self.key, self.log.drain(), name, ids.tolist(),
                                 None if positions is None else positions.tolist(), last_only))
            return self.shard(ids, local, positions, last_only=last_only)

    def mirrored(self, cache: SlotCache | KVCache) -> Mirrored:
        """A cache rank 0 keeps and changes between calls (the server's SlotCache): use the returned
        one everywhere; its changes are replayed on the other ranks."""
        return self.log.mirrored(cache)

    def inverse_frequencies(self) -> torch.Tensor:
        return self.shard.inverse_frequencies()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        raise ValueError("token embeddings on their own are not available with --tensor-parallel")

    def head(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the output layer on its own is not available with --tensor-parallel")

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        raise InvalidParameter("model", "embeddings (final hidden states) are not available with --tensor-parallel")

    def unload(self) -> None:
        """Free the other ranks' shards of this model."""
        with self.group.talking():
            self.group.send(Unload(self.key))


def load_parallel(source: str, *, world: int, dtype: str | None = None, device: str | None = None,
                  compile: bool = False, timeout: float = DEFAULT_TIMEOUT, threads: int | None = None) -> Checkpoint:
    """Rank 0: the checkpoint with its model split over `world` ranks (started here, or torchrun's).
    Any other rank (under torchrun): follows rank 0 until it stops, then exits."""
    if type(world) is not int or world < 1:
        raise ValueError(f"--tensor-parallel must be an integer >= 1, got {world!r}")
    if world == 1:
        return load_checkpoint(source, dtype=dtype, device=device, compile=compile)
    if compile:
        raise ValueError("--compile and --tensor-parallel do not combine (the compiled step has no collectives)")
    path = resolve_checkpoint(source)  # a wrong name fails here, before any rank starts,
    check_world(_config(path), world)  # and so does a model that does not split over `world` ranks
    group = start(world, device=device, timeout=timeout, threads=threads)
    if group.rank != 0:
        _follow_then_exit(lambda: group, group.rank)
    atexit.register(group.close)
    try:
        return load_on(group, source, dtype=dtype)
    except BaseException:
        group.close()
        raise


def _config(path) -> ModelConfig:
    """The config of a checkpoint directory or .gguf file, its weights unread."""
    return from_hf_config(open_gguf(path).config) if path.is_file() else read_config(path)


def load_on(group: RankGroup, source: str, *, dtype: str | None = None) -> Checkpoint:
    """Rank 0: a checkpoint loaded on every rank of a running group, each keeping its shard; rank 0
    alone reads the tokenizer and chat template."""
    key, checkpoint = _load_everywhere(group, source, dtype,
                                       lambda: load_checkpoint(source, dtype=dtype, device=str(group.device)))
    return dataclasses.replace(checkpoint, model=TensorParallel(checkpoint.model, key, group))


def model_on(group: RankGroup, source: str, *, dtype: str | None = None) -> TensorParallel:
    """Rank 0: the model alone (as loading.load_model), loaded and split over a running group."""
    key, model = _load_everywhere(group, source, dtype,
                                  lambda: load_model(source, dtype=dtype, device=str(group.device)))
    return TensorParallel(model, key, group)


def _load_everywhere(group: RankGroup, source: str, dtype: str | None, load) -> tuple[int, object]:
    """(the model's name among the ranks, what rank 0's `load()` returned, sharded)."""
    message = Load(next(_keys), str(source), dtype)
    with group.talking():
        group.send(message)
        return message.key, _load_shard(group, message, load)


def _load_shard(group: RankGroup, message: Load, load=None):
    """Every rank: load (rank 0: `load()`; the others: the model alone) and keep this rank's shard.
    Raises on rank 0 when any rank failed, naming it; the others get None then."""
    loaded, error = None, None
    try:
        loaded = load() if load else load_model(message.source, dtype=message.dtype, device=str(group.device))
        shard_model(getattr(loaded, "model", loaded), group.rank, group.world, group.group)
    except Exception as e:
        loaded, error = None, e
    errors = group.gather_status(None if error is None else f"{type(error).__name__}: {error}")
    if group.rank == 0 and error is not None:
        raise error
    failed = [(rank, text) for rank, text in enumerate(errors) if text]
    if group.rank == 0 and failed:
        raise ValueError(f"rank {failed[0][0]} could not load {message.source}: {failed[0][1]}")
    return None if failed else loaded


def follow(group: RankGroup) -> None:
    """A rank other than 0: run rank 0's messages until it says stop (or is lost)."""
    models: dict[int, tuple[nn.Module, Replicas]] = {}
    while True:
        message = group.receive()
        if message == STOP:
            break
        if isinstance(message, Load):
            model = _load_shard(group, message)
            if model is not None:
                models[message.key] = (model, _replicas(model, group))
        elif isinstance(message, Unload):
            models.pop(message.key, None)
        elif isinstance(message, Call):
            _run(*models[message.key], message, group.device)
    group.close()


def _replicas(model: nn.Module, group: RankGroup) -> Replicas:
    config = model.config
    heads = head_split(config.num_attention_heads, config.num_key_value_heads, group.rank, group.world)
    return Replicas(len(heads.kv), group.device)


def _run(model: nn.Module, replicas: Replicas, call: Call, device: torch.device) -> None:
    """One forward pass as rank 0 runs it. A bad call fails on every rank alike (its checks come
    before any collective), so an error here is rank 0's too, already reported there."""
    replicas.apply(call.ops)
    ids = torch.tensor(call.ids, device=device)
    positions = None if call.positions is None else torch.tensor(call.positions, device=device)
    try:
        with torch.inference_mode():
            model(ids, replicas.get(call.cache), positions, last_only=call.last_only)
    except (ValueError, IndexError):
        pass


def follower_main(rank: int, world: int, port: int, device: str, timeout: float, threads: int | None,
                  parent: int | None = None) -> None:
    """A rank started by rank 0 (process `parent`) on this machine (parallel_group._spawn)."""
    if threads:
        torch.set_num_threads(threads)
    _follow_then_exit(lambda: join(rank, world, port, device, timeout), rank, parent)


def _follow_then_exit(joined, rank: int, parent: int | None = None) -> None:
    """Join the group (joined() -> RankGroup), follow rank 0, exit: 0 when told to stop, 1 (one
    line on stderr) when the group is lost; 1 without a word when rank 0, its parent, is gone
    (the terminal has moved on: a line then would land in the middle of the next command)."""
    try:
        follow(joined())
    except RuntimeError as e:  # rank 0 or another rank is gone, or hung past the timeout
        if not orphaned(parent, wait=0.5):
            print(f"nexttok: tensor-parallel rank {rank} lost the group: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(0)
