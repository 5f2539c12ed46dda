"""The models a server holds, as Ollama holds them: loaded on first use, kept for `keep_alive`,
the least recently used unloaded to make room past `max_loaded`.

- pinned: the models the server was started with (`nexttok serve MODEL...`, create_app's list).
  Loaded before the first request, kept until the server stops, not counted in max_loaded.
- on demand: a name `nexttok pull` stored (in any of its spellings); never a path, a hub id or
  a bundled model a request makes up (a client could otherwise make the server read any folder,
  download anything, or load what its operator did not choose). The first request
  for it loads it (off the event loop, one load at a time); requests for it that come meanwhile
  wait for that same load. Each request sets how long the model stays once idle: its
  `keep_alive` (Ollama's field; -1 or any negative: forever, 0: unload as soon as it is idle),
  else the server's default (`--keep-alive`, 5 minutes). A model is idle once its scheduler
  holds no request (and GRACE has passed since the last one arrived, so that a request that has
  its model but not yet its place in the queue is not unloaded under it).

`reap_forever` (a task on the server's event loop) unloads models past their time. Unloading stops
the model's scheduler and drops the pool's references; the memory is freed when the last request
holding it is done.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError

GRACE = 1.0  # seconds after a request got its model during which the model counts as in use
TICK = 0.1  # seconds between the reaper's looks
FOREVER = None
UNSET = object()
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def keep_alive_seconds(value, default: float | None = 300.0) -> float | None:
    """A keep_alive as Ollama reads it, in seconds (None: forever): a number of seconds, or Go's
    duration text; negative: forever; absent: default. keep_alive_seconds("1h30m") == 5400.0;
    keep_alive_seconds(-1) is None; keep_alive_seconds("0") == 0.0."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number of seconds or a duration such as \"5m\"")
    seconds = float(value) if isinstance(value, (int, float)) else _duration(str(value).strip())
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"keep_alive {value!r} is not a duration")
    return None if seconds < 0 else seconds


def _duration(text: str) -> float:
    """Go's time.ParseDuration, plus a bare number of seconds: _duration("-1m30s") == -90.0."""
    try:
        return float(text)
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f'keep_alive {text!r} is not a duration (seconds, or such as "5m", "1h30m", "-1")')
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass
class Loaded:
    """The pool's record of one loaded model."""

    served: ServedModel
    pinned: bool
    keep_alive: float | None  # seconds once idle; None: forever
    last_used: float  # time.monotonic() of the last request's arrival, or of the last look that found it working
    arrived: float  # time.monotonic() of the last request's arrival

    def working(self) -> bool:
        """Whether its scheduler holds a request (waiting or running)."""
        scheduler = self.served.scheduler
        return bool(scheduler is not None and (scheduler.waiting or scheduler.running))

    def busy(self, now: float) -> bool:
        """Working, or a request got it less than GRACE ago (and may not be queued yet)."""
        return self.working() or now - self.arrived < GRACE

    def expires(self, now: float) -> float | None:
        """When (monotonic) it unloads if nothing more comes; None: never."""
        if self.pinned or self.keep_alive is None:
            return None
        return (now if self.working() else self.last_used) + self.keep_alive


class ModelPool:
    """The loaded models by name (`models`, the dict every route reads) and how they come and go.
    loader(name) -> ServedModel (blocking; run in a thread); attach(served) gives it a scheduler;
    loadable(name) -> the name to load it under, or None when the server may not load it."""

    def __init__(self, pinned: list[ServedModel], *, loader: Callable[[str], ServedModel],
                 attach: Callable[[ServedModel], None], loadable: Callable[[str], str | None],
                 keep_alive: float | None = 300.0, max_loaded: int = 3, timeout: float | None = None):
        if type(max_loaded) is not int or max_loaded < 1:
            raise ValueError(f"max_loaded must be an integer >= 1, got {max_loaded!r}")
        self.models: dict[str, ServedModel] = {m.name: m for m in pinned}
        now = time.monotonic()
        self.entries = {m.name: Loaded(m, True, FOREVER, now, now - GRACE) for m in pinned}
        self.loader, self.attach, self.loadable = loader, attach, loadable
        self.keep_alive, self.max_loaded, self.timeout = keep_alive, max_loaded, timeout
        self._loading: dict[str, asyncio.Future] = {}
        self._lock: asyncio.Lock | None = None  # made on the event loop that first loads

    # -- the request side -----------------------------------------------------------------------

    def find(self, name: str | None) -> ServedModel | None:
        """A loaded model a request names: by its name, Ollama's name:latest, or a stored name's
        other spellings (org/repo:q4_k_m for hf.co/Org/Repo:Q4_K_M); None names the only one."""
        if name is None:
            return next(iter(self.models.values())) if len(self.models) == 1 else None
        if name in self.models:
            return self.models[name]
        for served in self.models.values():
            if name == f"{served.name}:latest" or served.name == f"{name}:latest":
                return served
        return None

    async def get(self, name: str | None, keep_alive=UNSET) -> ServedModel:
        """The model a request names, loaded first if need be (the request waits, as do others for
        it meanwhile); keep_alive (seconds, None forever): how long it stays once idle (UNSET: the
        server's default). 404 for a name the server neither holds nor may load."""
        served = self.find(name)
        if served is None:
            key = self.loadable(name) if name is not None else None
            if key is None:
                raise self.not_found(name)
            served = self.find(key) or await self._load(key)
        self._touch(served.name, self.keep_alive if keep_alive is UNSET else keep_alive)
        return served

    def stored(self) -> list:
        """The stored models (store.py's manifests) that are not loaded now, the newest first."""
        from nexttok.checkpoints import store

        return [m for m in store.models() if m.name not in self.models]

    def not_found(self, name: str | None) -> APIError:
        return APIError(404, f"The model {name!r} does not exist (served: {', '.join(self.models) or 'none'}; "
                        "a model `nexttok pull` stored loads on first use)", param="model", code="model_not_found")

    def _touch(self, name: str, keep_alive: float | None) -> None:
        entry = self.entries.get(name)
        if entry is not None:
            entry.arrived = entry.last_used = time.monotonic()
            entry.keep_alive = keep_alive

    async def _load(self, key: str) -> ServedModel:
        if key not in self._loading:
            self._loading[key] = asyncio.ensure_future(self._load_now(key))
            self._loading[key].add_done_callback(lambda _: self._loading.pop(key, None))
        return await asyncio.shield(self._loading[key])

    async def _load_now(self, key: str) -> ServedModel:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one load at a time: two at once would add their peaks
            if key in self.models:
                return self.models[key]
            await self._make_room()
            try:
                served = await asyncio.to_thread(self._load_blocking, key)
            except APIError:
                raise
            except Exception as e:
                raise APIError(500, f"model {key!r} could not be loaded: {type(e).__name__}: {e}",
                               param="model", code="model_load_failed", kind="server_error") from None
            now = time.monotonic()
            self.entries[served.name] = Loaded(served, False, self.keep_alive, now, now)
            self.models[served.name] = served
            return served

    def _load_blocking(self, key: str) -> ServedModel:
        served = self.loader(key)
        served.name = key
        self.attach(served)
        served.scheduler.start()
        return served

    async def _make_room(self) -> None:
        """Unload the least recently used idle models loaded on demand until one more fits;
        while every one of them is busy, wait (up to the request timeout)."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while sum(not e.pinned for e in self.entries.values()) >= self.max_loaded:
            now = time.monotonic()
            idle = [e for e in self.entries.values() if not e.pinned and not e.busy(now)]
            if idle:
                await self.unload(min(idle, key=lambda e: (e.last_used, e.arrived)).served.name)
                continue
            if deadline is not None and now > deadline:
                raise APIError(503, f"every loaded model is busy and --max-loaded is {self.max_loaded}: "
                               "try again later", code="server_busy", kind="server_error")
            await asyncio.sleep(TICK)

    # -- unloading -----------------------------------------------------------------------------

    async def unload(self, name: str) -> bool:
        """Unload a model loaded on demand now (its open requests end with an error); False for a
        pinned or unknown one."""
        entry = self.entries.get(name)
        if entry is None or entry.pinned:
            return False
        del self.entries[name]
        self.models.pop(name, None)
        await asyncio.to_thread(entry.served.scheduler.stop, f"model {name!r} was unloaded")
        entry.served.scheduler = None
        del entry
        _free_memory()
        return True

    async def reap_forever(self) -> None:
        """Unload each model past its keep_alive, every TICK, until cancelled (a failure is logged
        and the reaping goes on)."""
        while True:
            await asyncio.sleep(TICK)
            try:
                await self._reap(time.monotonic())
            except Exception:
                logging.getLogger("nexttok.server").exception("unloading an idle model failed")

    async def _reap(self, now: float) -> None:
        for entry in list(self.entries.values()):
            if entry.pinned:
                continue
            if entry.working():
                entry.last_used = max(entry.last_used, now)
            elif not entry.busy(now) and entry.keep_alive is not None and now - entry.last_used >= entry.keep_alive:
                await self.unload(entry.served.name)

    def expires_at(self, name: str) -> datetime.datetime | None:
        """When a loaded model unloads if nothing more comes (UTC); None: it stays."""
        now = time.monotonic()
        moment = self.entries[name].expires(now)
        if moment is None:
            return None
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=moment - now)

    def stop_all(self) -> None:
        """Every loaded model's scheduler stops (the server is shutting down)."""
        for served in list(self.models.values()):
            if served.scheduler is not None:
                served.scheduler.stop()

    def request_stop_all(self) -> None:
        for served in list(self.models.values()):
            if served.scheduler is not None:
                served.scheduler.request_stop()


def stored_name(name: str) -> str | None:
    """The name a server may load a model under on demand: a stored name's own spelling
    (stored_name("org/repo:q4_k_m") == "hf.co/Org/Repo:Q4_K_M"); None for anything else."""
    from nexttok.checkpoints import store

    manifest = store.find(name)
    return manifest.name if manifest is not None else None


def _free_memory() -> None:
    """What an unloaded model held goes back now, not at the next collection (its tensors are in
    reference cycles through the model's modules); on CUDA, the allocator's cache too."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
