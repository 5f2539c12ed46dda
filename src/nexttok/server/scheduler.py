"""Continuous batching: requests join and leave one running batch between decode steps.

One worker thread per model owns the model and a SlotCache. Each loop it admits waiting requests
while slots are free (each prompt is prefilled alone into its slot and yields its first token),
then runs one decode step for every running request together: one forward pass of batch B, then
each request's own sampler, stop rules and detokenizer on its row. Finished, cancelled (client
gone) and timed-out requests leave between steps; their slot goes to the next in line.

Requests talk to the worker through an asyncio queue each; the worker hands results over with
loop.call_soon_threadsafe. The waiting line is bounded: when it is full, submit() refuses at once
(HTTP 429 with Retry-After).

A prompt is prefilled in chunks cut at fixed multiples of generation/prefill.BLOCK. With the prefix cache
on, its whole blocks that an earlier prompt already computed are copied in instead of prefilled;
the fixed cut makes those the very bits it would have computed, so the cache changes no token (on a
model with recurrent layers, with the layers' states checkpointed at those blocks' ends).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import torch

from nexttok.generation.loop import Generation, Step
from nexttok.models import Model
from nexttok.models.quant import rows_independent
from nexttok.models.slot_cache import SlotCache
from nexttok.server.metrics import Metrics
from nexttok.server.prefix_cache import PrefixCache, prefill

log = logging.getLogger("nexttok.server")


class QueueFull(Exception):
    """The waiting line is full."""


class RequestTimeout(Exception):
    """The request ran past its deadline."""


class ShuttingDown(Exception):
    """The server is stopping."""


class GenerationFailed(Exception):
    """Something broke inside one request's generation (the others go on)."""


PREFILLED = "prefilled"  # what a generation with max_tokens 0 yields once its prompt is scored


@dataclass
class Job:
    generation: Generation
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    submitted: float = field(default_factory=time.perf_counter)
    deadline: float | None = None
    cancelled: bool = False  # set by the request's coroutine when the client goes away
    last_step_at: float | None = None

    def emit(self, item) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Scheduler:
    def __init__(self, model: Model, *, max_running: int = 8, max_queue: int = 64, max_len: int | None = None,
                 timeout: float | None = None, metrics: Metrics | None = None, batch_invariant: bool = True,
                 prefix_cache_tokens: int = 0):
        self.model = model
        parameter = next(model.parameters())
        self.device = parameter.device
        self.cache = SlotCache.for_model(model.config, slots=max_running, max_len=max_len,
                                         dtype=parameter.dtype, device=self.device)
        self.max_queue, self.timeout = max_queue, timeout
        # batch_invariant: every decode step runs max_running rows (free slots as scratch), so a
        # request's tokens do not depend on what else is running; costs speed when few run. A
        # model whose every matmul is row-independent (quantized kernels) needs no padding. A compiled
        # model always runs max_running rows: one graph, compiled once, never a new shape.
        padded = batch_invariant and not rows_independent(model)
        self.pad_to = max_running if padded or model.compiled is not None else 1
        self.metrics = metrics or Metrics()
        # a model with recurrent layers reuses a prefix too: its blocks keep checkpoints of the states
        self.prefix = PrefixCache(self.cache, prefix_cache_tokens, self.metrics) if prefix_cache_tokens else None
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []  # running[i] holds cache slot i
        self._wake = threading.Condition()
        self._stopping = False
        self._stop_reason = "the server is shutting down"
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def start(self) -> None:
        """Run the loop in a thread of its own. (`nexttok serve` calls run() from the main thread
        instead: PyTorch's CPU kernels slow down when a second thread starts its own OpenMP team.)"""
        self._thread = threading.Thread(target=self.run, name="nexttok-scheduler", daemon=True)
        self._thread.start()

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    # -- the request side (event loop) ----------------------------------------------------------

    async def submit(self, generation: Generation) -> AsyncGenerator[Step, None]:
        """Steps of one generation as the worker produces them (none when its max_tokens is 0: the
        generator ends once the prompt is prefilled, its scores in generation.prompt_scores)."""
        if self._stopping:
            raise ShuttingDown(self._stop_reason)
        job = Job(generation, asyncio.get_running_loop(), asyncio.Queue())
        if self.timeout:
            job.deadline = job.submitted + self.timeout
        with self._wake:
            if len(self.waiting) >= self.max_queue:
                self.metrics.inc("rejected_total")
                raise QueueFull(f"{len(self.waiting)} requests are waiting already")
            self.waiting.append(job)
            self.metrics.set("queue_depth", len(self.waiting))
            self._wake.notify()
        self.metrics.inc("requests_total")
        finished = False
        try:
            while True:
                item = await job.out.get()
                if isinstance(item, Exception):
                    raise item
                if item is PREFILLED:
                    finished = True
                    return
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
        finally:
            if not finished:
                job.cancelled = True
                with self._wake:
                    self._wake.notify()

    def request_stop(self) -> None:
        """Ask the loop to end after its current step (safe from a signal handler)."""
        self._stopping = True
        if self._wake.acquire(blocking=False):
            self._wake.notify()
            self._wake.release()

    def stop(self, reason: str = "the server is shutting down") -> None:
        """End the loop, then every request still open with ShuttingDown."""
        with self._wake:
            self._stopping = True
            self._stop_reason = reason
            self._wake.notify()
        if self._thread is not None or self._running_loop:
            self._done.wait(timeout=30)
        for job in [*self.waiting, *self.running]:
            job.emit(ShuttingDown(reason))
        self.waiting.clear()
        self.running.clear()

    # -- the worker thread -------------------------------------------------------------------

    _running_loop = False

    def run(self) -> None:
        """The scheduling loop, until stop() or request_stop()."""
        self._running_loop = True
        # all of it in inference mode, not the forward passes only: a recurrent layer's states are made
        # by a forward pass (inference tensors), and claiming or releasing a slot writes them in between
        try:
            with torch.inference_mode():
                self._loop()
        finally:
            self._running_loop = False
            self._done.set()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.waiting and not self.running:
                    self._wake.wait()
                if self._stopping:
                    return
            self._drop_gone()
            self._admit()
            if self.running:
                self._decode()

    def _drop_gone(self) -> None:
        now = time.perf_counter()
        for slot in range(len(self.running) - 1, -1, -1):
            job = self.running[slot]
            if job.cancelled:
                self.metrics.inc("cancelled_total")
                self._release(slot)
            elif job.deadline is not None and now > job.deadline:
                self.metrics.inc("timeouts_total")
                job.emit(RequestTimeout("the request took longer than the server's request timeout"))
                self._release(slot)

    def _admit(self) -> None:
        while len(self.running) < self.cache.slots:
            with self._wake:
                if not self.waiting:
                    return
                job = self.waiting.popleft()
                self.metrics.set("queue_depth", len(self.waiting))
            if job.cancelled:
                self.metrics.inc("cancelled_total")
                continue
            slot = self.cache.claim()
            self.running.append(job)
            self.metrics.set("running", len(self.running))
            self._prefill(slot, job)

    def _prefill(self, slot: int, job: Job) -> None:
        start = time.perf_counter()
        try:
            generation = job.generation
            with torch.inference_mode():
                logits = prefill(self.model, self.cache, slot, generation.prompt_ids, self.prefix,
                                 scores=generation.prompt_scores)
                step = None if generation.max_tokens == 0 else generation.sample(logits, time.perf_counter() - start,
                                                                                 True)
        except Exception as e:  # this request fails; the others go on
            self._fail(slot, job, e)
            return
        if step is None:
            job.emit(PREFILLED)
            self._release(slot)
            return
        self.metrics.observe("time_to_first_token_seconds", time.perf_counter() - job.submitted)
        self._deliver(slot, job, step)

    def _decode(self) -> None:
        start = time.perf_counter()
        jobs = list(self.running)
        try:
            with torch.inference_mode():
                view = self.cache.running_view(self.pad_to)
                rows = [*range(len(jobs)), *[0] * (view.n - len(jobs))]  # scratch rows copy slot 0
                ids = torch.tensor([[jobs[r].generation.tokens[-1]] for r in rows], device=self.device)
                positions = torch.tensor([[self.cache.lengths[r]] for r in rows], device=self.device)
                logits = self.model(ids, view, positions, last_only=True)[:, -1]
                view.release_scratch()
        except Exception as e:  # the batch failed: every request in it gets the error
            for slot in range(len(jobs) - 1, -1, -1):
                self._fail(slot, jobs[slot], e)
            return
        elapsed = time.perf_counter() - start
        self.metrics.inc("decode_steps_total")
        results = []
        for slot, job in enumerate(jobs):
            try:
                with torch.inference_mode():
                    results.append(job.generation.sample(logits[slot], elapsed, False))
            except Exception as e:
                results.append(e)
        for slot in range(len(jobs) - 1, -1, -1):  # high slots first: a release moves the last slot
            result = results[slot]
            if isinstance(result, Exception):
                self._fail(slot, jobs[slot], result)
            else:
                self._deliver(slot, jobs[slot], result)

    def _deliver(self, slot: int, job: Job, step: Step) -> None:
        now = time.perf_counter()
        if job.last_step_at is not None:
            self.metrics.observe("time_per_output_token_seconds", now - job.last_step_at)
        job.last_step_at = now
        self.metrics.inc("tokens_generated_total")
        job.emit(step)
        if step.finish_reason is not None:
            self._release(slot)

    def _fail(self, slot: int, job: Job, error: Exception) -> None:
        """The request ends with an error its client sees in one line; the log keeps the traceback
        (nothing else records where a failure happened)."""
        log.error("generation failed in slot %d: %s: %s", slot, type(error).__name__, error, exc_info=error)
        self.metrics.inc("failed_total")
        job.emit(GenerationFailed(f"generation failed: {type(error).__name__}: {error}"))
        self._release(slot)

    def _release(self, slot: int) -> None:
        moved = self.cache.release(slot)
        if moved is not None:
            self.running[slot] = self.running[moved]
        self.running.pop()
        self.metrics.set("running", len(self.running))
