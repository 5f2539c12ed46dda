"""A pull on the terminal: hub_pull's steps as lines, its download as a rich bar; and the pull that
`run`, `chat` and `serve` make of a hub name not stored yet. (Apart from store.py so that
common.py can use it: store.py's commands use common.py.)"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def pull_with_progress(name: str, err: Console):
    """hub_pull.pull with its steps on err: a line for each, a rich bar for the download."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from nexttok.checkpoints.hub_pull import pull

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err) as bar:
        tasks: dict[str, object] = {}

        def report(step) -> None:
            if step.total is None:
                bar.console.print(f"[dim]{escape(step.status)}[/]")
            elif step.digest not in tasks:
                tasks[step.digest] = bar.add_task(step.status, total=step.total, completed=step.completed)
            else:
                bar.update(tasks[step.digest], completed=step.completed)

        return pull(name, report)


def ensure_pulled(name: str) -> None:
    """Pull a hub name that is not stored yet (`nexttok run hf.co/ORG/REPO:QUANT` pulls it first, as
    `ollama run` does); anything else is left to the loader."""
    from nexttok.checkpoints import store
    from nexttok.checkpoints.sources import looks_like_path, wants_pull

    if not looks_like_path(name) and wants_pull(name) and store.find(name) is None:
        err = Console(stderr=True, soft_wrap=True)
        err.print(f"[dim]{escape(name)} is not stored yet: pulling it[/]")
        pull_with_progress(name, err)
