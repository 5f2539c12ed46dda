"""The models a server holds, and the bridge from the synchronous step loop to async routes.

Each generation step runs in a worker thread; the request's coroutine awaits it, so when a
client disconnects the coroutine is cancelled at its next await and the generator is closed:
generation stops within one step and its KV cache is freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from nexttok.chat import ChatTemplate
from nexttok.generate import Step, stream
from nexttok.sampling import SamplingParams


@dataclass
class Metrics:
    requests_total: int = 0
    running: int = 0
    cancelled_total: int = 0
    tokens_generated_total: int = 0

    def prometheus(self) -> str:
        return "".join(
            f"# TYPE nexttok_{name} {'gauge' if name == 'running' else 'counter'}\nnexttok_{name} {value}\n"
            for name, value in vars(self).items()
        )


@dataclass
class ServedModel:
    name: str
    model: object
    tokenizer: object
    chat_template: ChatTemplate | None
    created: int = field(default_factory=lambda: int(time.time()))
    # one generation at a time per model (continuous batching comes with the scheduler)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    vocab_texts: list[str] | None = None  # display text of every id, for the explainer page

    @property
    def context_length(self) -> int:
        return self.model.config.max_position_embeddings


async def generate_steps(served: ServedModel, prompt_ids: list[int], params: SamplingParams, *,
                         max_tokens: int | None, stop: list[str], top_n: int,
                         metrics: Metrics) -> AsyncIterator[Step]:
    """Steps of one generation, each computed in a worker thread; stops early when cancelled."""
    steps = stream(served.model, served.tokenizer, prompt_ids, params, max_tokens=max_tokens,
                   stop=stop, top_n=top_n)
    finished = False
    async with served.lock:
        metrics.running += 1
        try:
            while not finished:
                step = await anyio.to_thread.run_sync(next, steps, None)
                if step is None:
                    break
                metrics.tokens_generated_total += 1
                finished = step.finish_reason is not None
                yield step
        finally:
            steps.close()
            metrics.running -= 1
            if not finished:
                metrics.cancelled_total += 1
