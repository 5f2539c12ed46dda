"""The models a server holds: each with its tokenizer, chat template and batch scheduler."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from nexttok.chat import ChatTemplate
from nexttok.server.scheduler import Scheduler


@dataclass
class ServedModel:
    name: str
    model: object
    tokenizer: object
    chat_template: ChatTemplate | None
    created: int = field(default_factory=lambda: int(time.time()))
    # explainer sessions run one at a time per model (generation goes through the scheduler)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    vocab_texts: list[str] | None = None  # display text of every id, for the explainer page
    scheduler: Scheduler | None = None  # started by create_app

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt + completion) this server runs for the model."""
        if self.scheduler is not None:
            return self.scheduler.max_len
        return self.model.config.max_position_embeddings
