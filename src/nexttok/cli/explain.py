"""`nexttok explain`: each step's next-token table and sampler chain, the logit lens, attention."""

from __future__ import annotations

import argparse
import math

from rich.console import Console
from rich.table import Table

from nexttok.cli import common


def cmd_explain(args: argparse.Namespace, out: Console) -> int:
    from nexttok.generation.loop import prompt_ids_for, stream

    if args.steps < 1 or args.top < 1:
        raise ValueError(f"--steps and --top must be >= 1, got {args.steps} and {args.top}")
    focus = _attention_focus(args.attention)  # checked before the model loads, like the sampling values
    name, prompt = common.model_and_prompt(args)
    params, stops = common.sampling_params(args), common.stop_strings(args)
    model, tokenizer = common.load(name, args)
    ids = prompt_ids_for(model, tokenizer, prompt)
    common.note_context_cut("--steps", args.steps, model, ids)
    chips = " ".join(f"[reverse]{common.escape(common.visible(p.text))}[/][dim]{p.id}[/]"
                     for p in tokenizer.pieces(ids))
    out.print(f"[bold]prompt[/] → {len(ids)} tokens: {chips}")
    steps = stream(model, tokenizer, ids, params, max_tokens=args.steps, stop=stops,
                   top_n=args.top, record_stages=True)
    text, path = "", []
    for step in steps:
        out.print(_explain_table(step, prompt + text))
        if args.lens:
            out.print(_lens_table(model, tokenizer, ids + path))
        text += step.text
        path.append(step.token_id)
    out.print(f"[bold]result:[/] {common.escape(prompt)}[green]{common.escape(text)}[/]")
    if focus is not None:
        out.print(_attention_heatmap(model, tokenizer, ids + path, *focus))
    return 0


def _attention_focus(spec: str | None) -> tuple[int, int | None] | None:
    """--attention LAYER[:HEAD] -> (layer, head or None for the mean): _attention_focus("3:1") == (3, 1)."""
    if spec is None:
        return None
    layer, _, head = spec.partition(":")
    try:
        return int(layer), (None if head in ("", "mean") else int(head))
    except ValueError:
        raise ValueError(f"--attention takes LAYER or LAYER:HEAD (numbers, HEAD may be 'mean'), got {spec!r}") from None


def _lens_table(model, tokenizer, ids: list[int]) -> Table:
    """The logit lens at the last position: each layer's top 3 and the final token's p and rank."""
    from nexttok.lesson import sections as lesson

    view = lesson.lens(model, tokenizer, lesson.inspect(model, ids), -1, 3)
    final = common.escape(common.visible(view["final"]["text"]))
    table = Table(title=f"logit lens: what each layer would predict (final: {final!r})", title_justify="left",
                  header_style="bold")
    for column, justify in (("layer", "right"), ("top 3", "left"), ("final p", "right"), ("rank", "right"),
                            ("", "left")):
        table.add_column(column, justify=justify)
    for row in view["layers"]:
        top = "  ".join(f"{common.escape(common.visible(t['text']))} {t['p']:.0%}" for t in row["top"])
        name = "embed" if row["layer"] == 0 else str(row["layer"])
        table.add_row(name, top, f"{row['final_p']:.2%}", str(row["final_rank"]), "█" * round(row["final_p"] * 20))
    return table


def _attention_heatmap(model, tokenizer, ids: list[int], layer: int, head: int | None, shown: int = 32) -> Table:
    """The attention matrix of one layer and head (or their mean) over the whole text, darker = more
    weight; the last `shown` tokens when the text is longer."""
    from nexttok.lesson import sections as lesson

    matrix = lesson.attention_matrix(lesson.inspect(model, ids), layer, head)[-shown:, -shown:]
    labels = [common.escape(common.visible(t))[:8] for t in (lesson.token_text(tokenizer, i) for i in ids[-shown:])]
    which = "mean of the heads" if head is None else f"head {head}"
    table = Table(title=f"attention, layer {layer}, {which}: row = token attending, column = token attended to",
                  title_justify="left", show_lines=False, padding=0, header_style="dim")
    table.add_column("", justify="right")
    for j in range(len(labels)):
        table.add_column(str(j), justify="center", width=2)
    for i, row in enumerate(matrix.tolist()):
        cells = [_shade(w) for w in row[: i + 1]] + ["" for _ in row[i + 1 :]]
        table.add_row(f"{i} {labels[i]} ", *cells)
    table.caption = "darker = more weight; columns are numbered as the rows"
    return table


def _shade(weight: float) -> str:
    """A cell coloured by weight: 0 white, 1 dark blue (two spaces, so it reads as a block)."""
    level = round(255 - 200 * min(max(weight, 0.0), 1.0) ** 0.5)
    return f"[on rgb({level},{level},255)]  [/]"


def _explain_table(step, text_so_far: str) -> Table:
    raw, final = step.stages[0], step.stages[-1]
    after = dict(zip(final.top_ids, final.top_probs, strict=True))
    fully_listed = final.kept <= len(final.top_ids)
    title = (f"step {step.index + 1}: after …{common.escape(repr(text_so_far[-30:]))} — chose "
             f"{common.escape(common.visible(step.token_text))!r} (id {step.token_id}, rank {step.rank})")
    table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    for name, justify in (("rank", "right"), ("token", "left"), ("id", "right"), ("p", "right"),
                          ("", "left"), ("after sampler", "right")):
        table.add_column(name, justify=justify)
    for rank, alt in enumerate(step.top, 1):
        p = math.exp(alt.logprob)
        q = after.get(alt.id)
        shown = f"{q:.2%}" if q is not None else ("cut" if fully_listed else "<")
        style = "bold green" if alt.id == step.token_id else ""
        table.add_row(str(rank), common.escape(common.visible(alt.text)), str(alt.id), f"{p:.2%}",
                      "█" * round(p * 30), shown, style=style)
    other = 1 - sum(math.exp(a.logprob) for a in step.top)
    table.add_row("", "[dim]everything else[/]", "", f"{max(other, 0.0):.2%}", "", "")
    chain = " → ".join(f"{r.name} {r.kept}" for r in step.stages)
    draw = f"draw u={step.draw:.3f}" if step.draw is not None else "greedy"
    table.caption = (f"tokens kept: {chain}; entropy {raw.entropy:.2f} → {final.entropy:.2f} bits; "
                     f"{draw}; {step.elapsed * 1000:.0f} ms")
    table.caption_justify = "left"
    return table


def add_parsers(sub) -> None:
    explain = sub.add_parser("explain", help="show each step: the next-token table and the sampler")
    common.add_generation_args(explain, max_tokens=None)
    explain.add_argument("--steps", type=int, default=5,
                         help="tokens to explain; at most to the end of the context window (default %(default)s)")
    explain.add_argument("--top", type=int, default=10, help="rows per table (default %(default)s)")
    explain.add_argument("--lens", action="store_true",
                         help="after each step, what every layer would predict (the logit lens)")
    explain.add_argument("--attention", metavar="LAYER[:HEAD]", default=None,
                         help="at the end, the attention matrix of a layer and head (no head: their mean)")
    explain.set_defaults(func=cmd_explain)

    neighbors = sub.add_parser("neighbors", help="a word's nearest tokens in the model's embedding matrix")
    neighbors.add_argument("words", nargs="+", metavar="WORD",
                           help="words to look up; three or more also get their pairwise cosine similarities")
    neighbors.add_argument("--model", default=common.DEFAULT_MODEL, help="(default: the bundled %(default)s)")
    neighbors.add_argument("-k", type=int, default=10, help="neighbours per word (default %(default)s)")
    neighbors.add_argument("--dtype", default=None, help=common.DTYPE_HELP)
    neighbors.add_argument("--device", default=None)
    neighbors.set_defaults(func=cmd_neighbors, compile=False)


def cmd_neighbors(args: argparse.Namespace, out: Console) -> int:
    import torch

    from nexttok.lesson import sections as lesson

    if not 1 <= args.k <= 100:
        raise ValueError(f"-k must be in 1..100, got {args.k}")
    for word in args.words:
        lesson.word_ids_check(word)  # before the model loads
    model, tokenizer = common.load(args.model, args)
    vectors = []
    for word in args.words:
        ids, vector = lesson.word_vector(model, tokenizer, word)
        vectors.append(vector)
        table = Table(title=f"nearest to {word!r} ({len(ids)} token{'s' if len(ids) > 1 else ''}: "
                      f"{' '.join(common.visible(lesson.token_text(tokenizer, i)) for i in ids)})",
                      title_justify="left", header_style="bold")
        for column in ("token", "id", "cosine"):
            table.add_column(column, justify="left" if column == "token" else "right")
        for i, cosine in lesson.neighbors(model, vector, args.k, exclude=ids):
            table.add_row(common.escape(common.visible(lesson.token_text(tokenizer, i))), str(i), f"{cosine:.3f}")
        out.print(table)
    if len(args.words) >= 3:
        out.print(_cosine_table(args.words, lesson.cosine_matrix(torch.stack(vectors))))
    return 0


def _cosine_table(words: list[str], cosine) -> Table:
    table = Table(title="cosine similarity of the words' embeddings", title_justify="left", header_style="bold")
    table.add_column("")
    for word in words:
        table.add_column(common.escape(word), justify="right")
    for word, row in zip(words, cosine.tolist(), strict=True):
        table.add_row(common.escape(word), *(f"{c:.2f}" for c in row))
    return table
