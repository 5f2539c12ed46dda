"""`nexttok chat [MODEL]`: a multi-turn REPL over the model's own chat template, as `ollama run` is.

Each turn renders the whole conversation with the template and streams the answer. When that
prompt plus max_tokens would not fit the context window, the oldest turns are dropped (the system
prompt kept) and the REPL says how many. Ctrl-C stops an answer and keeps what it said in the
history, unmarked, as after a max_tokens cut (an answer stopped before its first token takes its
message with it). With a nexttok server at $NEXTTOK_HOST serving the model, the chat goes through
it (remote.py: the server's template via /tokenize, answers from /v1/completions); the model stays
loaded there. One dim line says which way it went.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path

from rich.console import Console

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.cli import common, traces
from nexttok.errors import InvalidParameter
from nexttok.generation.stages import SETTINGS, Bound

PROMPT, MORE = ">>> ", "... "
SAMPLING = (*SETTINGS, "seed")  # every stage's settings (nexttok.generation.stages), as `run`'s flags
HELP = """commands:
  /set NAME VALUE   a sampler setting (/show lists them; seed: a number or none; a list or a
                    mapping as JSON: /set dry_sequence_breakers ["\\n"]), max_tokens
  /set system TEXT  the system prompt (no TEXT: none)
  /show             the settings and the tokens used of the context window
  /clear            forget the conversation (the system prompt stays)
  /save FILE        write the conversation as JSON (OpenAI's messages)
  /load FILE        read one back
  /help, /bye       this text; leave (Ctrl-D too)
Ctrl-C stops an answer (what was said stays) or clears the line. \"\"\" starts and ends a multi-line message."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Model text made safe for a terminal (no escape sequences): printable("a\\x1b[2J") == "a\\\\x1b[2J"."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _oldest_turn_dropped(turns: list[dict]) -> list[dict]:
    """turns less the first one (a message and the replies up to the next user message):
    [u1, a1, u2, a2] -> [u2, a2]."""
    rest = turns[1:]
    return rest[next((i for i, m in enumerate(rest) if m["role"] == "user"), len(rest)):]


class Conversation:
    """The messages of one chat and what they cost in tokens under the model's template (encode:
    the server's rendering instead, (messages, generation_prompt) -> ids)."""

    def __init__(self, template, tokenizer, system: str | None = None, encode=None):
        self.template, self.tokenizer, self.encode = template, tokenizer, encode
        self.system, self.turns = system, []

    def messages(self, turns: list[dict] | None = None) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + (self.turns if turns is None else turns)

    def ids(self, messages: list[dict], generation_prompt: bool = True) -> list[int]:
        """Token ids of messages as the template writes them (the server encodes the same way)."""
        if not messages:
            return []
        if self.encode is not None:
            return self.encode(messages, generation_prompt)
        return self.tokenizer.encode(self.template.render(messages, add_generation_prompt=generation_prompt))

    def used(self) -> int:
        return len(self.ids(self.messages(), generation_prompt=False))

    def add(self, message: dict, budget: int) -> tuple[list[int], int, int]:
        """Append message, first dropping the oldest turns until the prompt is at most budget tokens;
        (prompt ids, turns dropped, tokens they took). A message that cannot fit changes nothing."""
        kept = list(self.turns)
        first = ids = self.ids(self.messages(kept + [message]))
        dropped = 0
        while len(ids) > budget and kept:
            kept, dropped = _oldest_turn_dropped(kept), dropped + 1
            ids = self.ids(self.messages(kept + [message]))
        if len(ids) > budget:
            raise ValueError(f"this message is {len(ids)} tokens with the template and system prompt; {budget} "
                             "fit (the context window less max_tokens): shorten it or /set max_tokens lower")
        self.turns = kept + [message]
        return ids, dropped, len(first) - len(ids)

    def load(self, data) -> None:
        """Messages in OpenAI's shape (a list, or an object holding "messages"); a system message may
        only come first (it becomes the system prompt)."""
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            raise ValueError('expected a list of messages or an object with "messages"')
        for i, m in enumerate(messages):
            roles = ("system", "user", "assistant") if i == 0 else ("user", "assistant")
            if not isinstance(m, dict) or m.get("role") not in roles or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}] must be {{role: {' | '.join(roles)}, content: a string}}")
        has_system = bool(messages) and messages[0]["role"] == "system"
        turns = [{"role": m["role"], "content": m["content"]} for m in messages[has_system:]]
        system = messages[0]["content"] if has_system else None
        if messages:
            self.ids(messages)  # a template that refuses them says so now, not at the next turn
        self.system, self.turns = system, turns


def _check_max_tokens(value, context: int) -> int:
    if type(value) is not int or not 1 <= value < context:
        raise InvalidParameter("max_tokens", f"max_tokens must be an integer in [1, {context - 1}] (room kept for "
                               f"the answer in the {context}-token context window), got {value!r}")
    return value


def _number(name: str, text: str):
    """A setting's value as typed: _number("top_k", "40") == 40; _number("seed", "none") is None; a
    list or mapping setting as JSON: _number("dry_sequence_breakers", '["\\n"]') == ["\n"]."""
    text = text.strip()
    if name == "seed" and text.lower() in ("none", "off", ""):
        return None
    if name in SETTINGS and not isinstance(SETTINGS[name], Bound):
        try:
            value = json.loads(text)
        except ValueError:
            raise InvalidParameter(name, f"{name} must be JSON (a list or an object), got {text!r}") from None
        try:
            return SETTINGS[name].from_json(value) if isinstance(value, (list, dict)) else value
        except ValueError:  # a mapping's key that is not a token id
            raise InvalidParameter(name, f"{name} keys must be token ids, got {text!r}") from None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise InvalidParameter(name, f"{name} must be a number, got {text!r}")


class ChatSession:
    """One REPL: its conversation, settings and the commands that change them. The model is the
    checkpoint in this process, or (server) one a nexttok server serves (checkpoint None)."""

    def __init__(self, checkpoint, name: str, args: argparse.Namespace, out: Console, server=None):
        self.name, self.out, self.server = name, out, server
        self.checkpoint, self.trace, self.replies = checkpoint, args.trace, 0  # --trace FILE: FILE-1.jsonl, ...
        self.err = Console(stderr=True, soft_wrap=True)
        if server is not None:
            self.chat = Conversation(None, None, args.system or None, encode=server.encode)
            self.chat.ids([{"role": "user", "content": ""}])  # the server loads it; no template: an error now
            self.context = min(server.context, args.context or server.context)
        else:
            self._here(checkpoint, args)
        params = common.sampling_params(args)  # the library's checks, as `run` makes them
        self.sampling = {n: getattr(params, n) for n in SAMPLING}
        self.max_tokens = _check_max_tokens(args.max_tokens, self.context)

    def _here(self, checkpoint, args: argparse.Namespace) -> None:
        from nexttok.generation.loop import context_window

        if checkpoint.chat_template is None:
            raise ValueError(f"{self.name} has no chat template (none in its tokenizer_config.json, "
                             "chat_template.jinja or GGUF metadata); `nexttok run` completes plain text")
        self.model, self.tokenizer = checkpoint.model, checkpoint.tokenizer
        self.chat = Conversation(checkpoint.chat_template, checkpoint.tokenizer, args.system or None)
        self.context = context_window(self.model.config, args.context)
        self.stop_ids = list(self.model.config.eos_token_id)
        for text in checkpoint.chat_template.stop_texts:  # e.g. <|im_end|>; gpt-oss's <|return|>, <|call|>
            eot = self.tokenizer.token_to_id(text)
            if eot is not None and eot not in self.stop_ids:
                self.stop_ids.append(eot)

    def repl(self) -> int:
        """Read, answer, repeat, until /bye or Ctrl-D."""
        self.out.print(f"chat with {common.escape(self.name)} (context {self.context} tokens); "
                       "/help for commands, /bye or Ctrl-D to leave")
        while True:
            try:
                line = self._read()
            except KeyboardInterrupt:  # Ctrl-C at the prompt: drop the line, prompt again
                print()
                continue
            except EOFError:
                print()
                return 0
            try:
                if not self.handle(line):
                    return 0
            except (ValueError, OSError) as e:
                self.err.print(f"[red]error:[/] {common.escape(str(e))}")
            except KeyboardInterrupt:
                print()

    def _read(self) -> str:
        """One message; a line starting with \"\"\" runs on until a line ending with \"\"\"."""
        line = input(PROMPT)
        if not line.lstrip().startswith('"""'):
            return line
        text = line.lstrip()[3:]
        while not text.endswith('"""'):
            text += "\n" + input(MORE)
        return text[:-3]

    def handle(self, line: str) -> bool:
        """Run a command or answer a message; False to leave."""
        if not line.strip():
            return True
        if not line.startswith("/"):
            self.answer(line)
            return True
        command, _, rest = line.partition(" ")
        if command == "/bye":
            return False
        commands = {"/set": self.set, "/show": self.show, "/clear": self.clear, "/save": self.save,
                    "/load": self.load, "/help": lambda _: self.out.print(common.escape(HELP))}
        if command not in commands:
            raise ValueError(f"unknown command {command}; /help lists them")
        commands[command](rest.strip())
        return True

    def answer(self, text: str) -> None:
        ids, dropped, tokens = self.chat.add({"role": "user", "content": text}, self.context - self.max_tokens)
        if dropped:
            self.out.print(f"[yellow]context full: dropped the {dropped} oldest turn{'s' * (dropped > 1)} "
                           f"({tokens} tokens)[/]")
        try:
            reply, count, finish = self._stream(ids)
        except BaseException:  # an error, or a second Ctrl-C while the first was handled
            self.chat.turns.pop()  # the message got no answer: not part of the conversation
            raise
        if finish == "interrupted" and not count:
            self.chat.turns.pop()  # stopped before a word: as if the message was never sent
        else:
            self.chat.turns.append({"role": "assistant", "content": reply})
        if finish == "interrupted":
            self.out.print(f"[dim](stopped after {count} tokens; {'kept in' if count else 'nothing added to'} "
                           "the history)[/]")
        elif finish == "length":
            self.out.print(f"[dim](cut at max_tokens {self.max_tokens})[/]")

    def _stream(self, ids: list[int]) -> tuple[str, int, str | None]:
        """Stream an answer to the terminal: (its text, tokens, finish reason or "interrupted")."""
        from nexttok.generation.loop import stream
        from nexttok.generation.sampling import SamplingParams

        params = SamplingParams(**self.sampling)
        if self.server is not None:
            steps, trace = self.server.answer(ids, self.max_tokens, self.sampling), None
        else:
            steps = stream(self.model, self.tokenizer, ids, params, max_tokens=self.max_tokens,
                           stop_token_ids=self.stop_ids, top_n=traces.TOP_N if self.trace else 0,
                           logprobs=bool(self.trace))  # scores only for a trace: nothing else shows them
            trace = self._trace(ids, params)
        parts, finish = [], None
        try:
            for step in steps:
                if trace is not None:
                    trace.step(step)
                sys.stdout.write(printable(step.text))
                sys.stdout.flush()
                parts.append(step.text)
                finish = step.finish_reason
        except KeyboardInterrupt:
            steps.close()
            finish = "interrupted"
        finally:
            if trace is not None:
                trace.close()  # an interrupted reply's trace has no end line: it did not finish
        sys.stdout.write("\n")
        sys.stdout.flush()
        return "".join(parts), len(parts), finish

    def _trace(self, ids: list[int], params):
        """The trace of the next reply (--trace chat.jsonl: chat-1.jsonl, chat-2.jsonl, ...), or None."""
        if not self.trace:
            return None
        self.replies += 1
        path = Path(self.trace)
        path = path.with_name(f"{path.stem}-{self.replies}{path.suffix or '.jsonl'}")
        return traces.writer(str(path), traces.header(self.checkpoint, self.name, None, ids, params,
                                                      max_tokens=self.max_tokens, stop=[],
                                                      stop_token_ids=self.stop_ids))

    def set(self, rest: str) -> None:
        from nexttok.generation.sampling import SamplingParams

        name, _, value = rest.partition(" ")
        name = name.replace("-", "_")
        if name == "system":
            self.chat.system = value.strip() or None
            self.out.print("system prompt " + ("set" if self.chat.system else "cleared"))
            return
        if name == "max_tokens":
            self.max_tokens = _check_max_tokens(_number(name, value), self.context)
            self.out.print(f"max_tokens = {self.max_tokens}")
        elif name in SAMPLING:
            changed = {**self.sampling, name: _number(name, value)}
            SamplingParams(**changed)  # validate(): a value out of range raises, naming it
            self.sampling = changed
            self.out.print(f"{name} = {changed[name]}")
        else:
            raise ValueError(f"/set takes a sampler setting (/show lists them), max_tokens or system; got {name!r}")

    def show(self, _: str = "") -> None:
        rows = [("model", self.name), *self.sampling.items(), ("max_tokens", self.max_tokens),
                ("system", self.chat.system if self.chat.system is not None else "(none)")]
        for name, value in rows:
            self.out.print(f"  {name:<20}{common.escape(printable(str(value)))}")
        turns = sum(m["role"] == "user" for m in self.chat.turns)
        self.out.print(f"  {'context':<20}{self.chat.used()} of {self.context} tokens used ({turns} "
                       f"turn{'s' * (turns != 1)}; {self.max_tokens} kept for each answer)")

    def clear(self, _: str = "") -> None:
        self.chat.turns = []
        self.out.print("conversation cleared" + (" (the system prompt stays)" if self.chat.system else ""))

    def save(self, file: str) -> None:
        if not file:
            raise ValueError("/save needs a FILE")
        data = {"model": self.name, "messages": self.chat.messages()}  # a chat completions request body
        Path(file).expanduser().write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        self.out.print(f"saved {len(data['messages'])} messages to {common.escape(file)}")

    def load(self, file: str) -> None:
        if not file:
            raise ValueError("/load needs a FILE")
        path = Path(file).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{file}: no such file") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{file} is not valid JSON: {e}") from None
        try:
            self.chat.load(data)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None
        self.out.print(f"loaded {len(self.chat.messages())} messages from {common.escape(file)} "
                       f"({self.chat.used()} tokens)")


IN_PROCESS_ONLY = {"--trace": None, "--dtype": None, "--device": None, "--compile": False}


def cmd_chat(args: argparse.Namespace, out: Console) -> int:
    if args.context is not None and args.context < 2:
        raise ValueError(f"--context must be >= 2, got {args.context}")
    common.sampling_params(args)  # bad flags fail before the model loads
    from nexttok.cli.pulling import ensure_pulled

    ensure_pulled(args.model)
    session = _session(args, out)
    with contextlib.suppress(ImportError):  # not on every platform; plain input() still works
        import readline  # noqa: F401  (importing it gives input() line editing and history)
    return session.repl()


def _session(args: argparse.Namespace, out: Console) -> ChatSession:
    """The chat through the server when one serves the model (remote.py), else here; a dim line says which."""
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.cli import remote

    err = Console(stderr=True, soft_wrap=True)
    use_server, line = remote.where(args, args.model, remote.in_process_only(args, IN_PROCESS_ONLY))
    if use_server:
        try:
            session = ChatSession(None, args.model, args, out, server=remote.ServerModel(args.model))
            err.print(f"[dim]{common.escape(line)}[/]")
            return session
        except remote.ServerError as e:
            if e.status != 404:
                raise
            line = remote.fallback_line(args.model, e)
    err.print(f"[dim]loading {common.escape(args.model)} ...[/]")
    checkpoint = load_checkpoint(args.model, dtype=args.dtype, device=args.device, compile=args.compile)
    session = ChatSession(checkpoint, args.model, args, out)
    err.print(f"[dim]{common.escape(line)}[/]")  # once it loaded: an error before it is the one line
    return session


def add_parsers(sub) -> None:
    p = sub.add_parser("chat", help="talk with a model, turn by turn (its chat template, streamed)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL",
                   help="a checkpoint directory, a .gguf file, a bundled model name or a hub id "
                   f"(default: the bundled {DEFAULT_MODEL}); it must have a chat template")
    p.add_argument("--system", default=None, help="the system prompt (/set system changes it)")
    p.add_argument("--context", type=int, default=None,
                   help="tokens of context window to use (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=512, help="longest answer, kept free in the context "
                   "(default %(default)s)")
    common.add_sampling_args(p)  # the same flags as `nexttok run`
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="record each reply as a trace: FILE-1.jsonl, FILE-2.jsonl, ... (nexttok replay / diff)")
    p.add_argument("--dtype", default=None, help=common.DTYPE_HELP)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--compile", action="store_true", help=common.COMPILE_HELP)
    p.add_argument("--no-server", action="store_true",
                   help="load the model in this process even when a nexttok server answers at $NEXTTOK_HOST")
    p.set_defaults(func=cmd_chat)
