"""`nexttok chat`: driven in a pseudo-terminal (pexpect) on the tiny chat model, its answers checked
against the library's `generate` on the same rendered prompt; the REPL's rules checked in-process."""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from nexttok.checkpoints.loading import load_checkpoint
from nexttok.cli import build_parser, main
from nexttok.cli.chat import PROMPT, ChatSession, Conversation, _oldest_turn_dropped, printable
from nexttok.errors import InvalidParameter
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams


@pytest.fixture(scope="module")
def checkpoint(chat_model_dir):
    return load_checkpoint(chat_model_dir)


def _ctrl_c_as_a_terminal_sends_it() -> None:
    """In the child before it runs: SIGINT back to its default, so that Python installs its Ctrl-C
    handler whatever this test process's own disposition is (an ignored SIGINT would be inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(model_dir: Path, cwd: Path, *options: str) -> pexpect.spawn:
    """The REPL in a pseudo-terminal, at its first prompt. TERM=dumb: no colours, no bracketed paste.
    One thread: on a 2-core machine the child's OpenMP threads spin between its steps and starve this
    process, which then reads the streamed answer only after the whole of it was written."""
    child = pexpect.spawn(sys.executable, ["-m", "nexttok", "chat", str(model_dir), *options], cwd=str(cwd),
                          env={**os.environ, "TERM": "dumb", "OMP_NUM_THREADS": "1"}, encoding="utf-8", timeout=120,
                          dimensions=(24, 200), preexec_fn=_ctrl_c_as_a_terminal_sends_it)
    child.expect_exact(PROMPT)
    return child


def say(child: pexpect.spawn, line: str) -> str:
    """Send a line; what the REPL printed before its next prompt (the echo left out, \\r\\n as \\n)."""
    child.sendline(line)
    child.expect_exact(line + "\r\n")
    child.expect_exact(PROMPT)
    return child.before.replace("\r\n", "\n")


def greedy(checkpoint, messages: list[dict], max_tokens: int) -> str:
    """The library's answer at temperature 0 to messages rendered by the model's template."""
    ids = checkpoint.tokenizer.encode(checkpoint.chat_template.render(messages))
    return generate(checkpoint.model, checkpoint.tokenizer, ids, SamplingParams(temperature=0),
                    max_tokens=max_tokens).text


def tokens(checkpoint, messages: list[dict], generation_prompt: bool = True) -> int:
    text = checkpoint.chat_template.render(messages, add_generation_prompt=generation_prompt)
    return len(checkpoint.tokenizer.encode(text))


def test_chat_in_a_terminal(chat_model_dir, checkpoint, tmp_path):
    child = spawn(chat_model_dir, tmp_path, "--seed", "7", "--max-tokens", "8")
    try:
        assert say(child, "/set temperature 0") == "temperature = 0\n"
        first, second = say(child, "Hello there"), say(child, "And then?")
        assert say(child, "/set temperature -1").startswith("error: temperature must be a number >= 0, got -1\n")
        assert say(child, "/set max_tokens 3000") == "max_tokens = 3000\n"
        gc.collect()  # no collection of this process's heap (after the whole suite: long) while the answer
        gc.disable()  # streams: the Ctrl-C below must arrive before the tiny model's 3000 tokens are out
        child.sendline("Tell me everything")
        child.expect_exact("Tell me everything\r\n")
        child.expect(r"\S")  # the answer is streaming: interrupted at once (this tiny model writes its
        child.send("\x03")  # 3000 tokens in well under a second now that a greedy step picks in C++)
        child.expect(r"\(stopped after (\d+) tokens; kept in the history\)")
        gc.enable()
        cut = int(child.match.group(1))
        child.expect_exact(PROMPT)
        shown = say(child, "/show")  # still in the REPL
        saved, again = tmp_path / "chat.json", tmp_path / "again.json"
        assert say(child, f"/save {saved}") == f"saved 6 messages to {saved}\n"
        assert say(child, "/clear") == "conversation cleared\n"
        assert "  context             0 of 4096 tokens used (0 turns" in say(child, "/show")
        assert say(child, f"/load {saved}").startswith(f"loaded 6 messages from {saved}")
        say(child, f"/save {again}")
        assert say(child, "/load missing.json") == "error: missing.json: no such file\n"
        child.send("half a line")
        child.send("\x03")  # Ctrl-C at the prompt: the line goes, the REPL stays
        child.expect_exact(PROMPT)
        assert "max_tokens          3000" in say(child, "/show")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        gc.enable()
        child.close(force=True)
    assert child.exitstatus == 0

    messages = json.loads(saved.read_text(encoding="utf-8"))["messages"]
    assert json.loads(again.read_text(encoding="utf-8"))["messages"] == messages  # /save, /load, /save
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    assert [m["content"] for m in messages[::2]] == ["Hello there", "And then?", "Tell me everything"]
    # each greedy answer is what generate gives for the conversation so far, and is what was shown
    assert messages[1]["content"] == greedy(checkpoint, messages[:1], 8)
    assert messages[3]["content"] == greedy(checkpoint, messages[:3], 8)
    assert first.startswith(printable(messages[1]["content"]) + "\n(cut at max_tokens 8)")
    assert second.startswith(printable(messages[3]["content"]) + "\n")
    # the stopped answer: cut early, kept as far as it went
    assert 0 < cut < 3000 and messages[5]["content"]
    assert greedy(checkpoint, messages[:5], cut).startswith(messages[5]["content"])
    assert "  temperature         0\n" in shown and "  seed                7\n" in shown
    assert f"  context             {tokens(checkpoint, messages, False)} of 4096 tokens used (3 turns" in shown


def test_a_conversation_that_outgrows_the_context_drops_its_oldest_turns(chat_model_dir, checkpoint, tmp_path):
    context, max_tokens = 96, 8
    child = spawn(chat_model_dir, tmp_path, "--context", str(context), "--max-tokens", str(max_tokens),
                  "--temperature", "0", "--system", "Be brief.")
    try:
        for n in range(6):
            say(child, f"/save before{n}.json")
            out = say(child, f"Question {n}?")
            if "context full" in out:
                break
        say(child, "/save after.json")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        gc.enable()
        child.close(force=True)
    assert child.exitstatus == 0
    assert n > 0 and out.startswith("context full: dropped the 1 oldest turn (")
    before = json.loads((tmp_path / f"before{n}.json").read_text())["messages"]
    after = json.loads((tmp_path / "after.json").read_text())["messages"]
    asked = {"role": "user", "content": f"Question {n}?"}
    assert after[0] == before[0] == {"role": "system", "content": "Be brief."}  # the system prompt stays
    assert after[1:-2] == before[3:] and after[-2] == asked  # the first question and its answer went
    dropped = tokens(checkpoint, before + [asked]) - tokens(checkpoint, after[:-1])
    assert out.startswith(f"context full: dropped the 1 oldest turn ({dropped} tokens)\n")
    assert tokens(checkpoint, after[:-1]) + max_tokens <= context  # room was kept for the answer
    assert after[-1]["content"] == greedy(checkpoint, after[:-1], max_tokens)


def session(checkpoint, chat_model_dir, *options: str) -> tuple[ChatSession, io.StringIO]:
    args = build_parser().parse_args(["chat", str(chat_model_dir), *options])
    text = io.StringIO()
    return ChatSession(checkpoint, "tiny", args, Console(file=text, soft_wrap=True)), text


def test_set_checks_values_with_the_librarys_rules(checkpoint, chat_model_dir):
    chat, _ = session(checkpoint, chat_model_dir, "--max-tokens", "8")
    for line, message in [
        ("/set top_p 0", "top_p must be in (0, 1], got 0"),
        ("/set top_k 2.5", "top_k must be an integer >= 0, got 2.5"),
        ("/set min_p lots", "min_p must be a number, got 'lots'"),
        ("/set seed -1", "seed must be an integer in [0, 2**63), got -1"),
        ("/set max_tokens 4096", "max_tokens must be an integer in [1, 4095] (room kept for the answer in the "
                                 "4096-token context window), got 4096"),
        ("/set colour blue", "/set takes a sampler setting (/show lists them), max_tokens or system; got 'colour'"),
        ("/frobnicate", "unknown command /frobnicate; /help lists them"),
    ]:
        with pytest.raises(ValueError) as e:
            chat.handle(line)
        assert str(e.value) == message
    assert chat.sampling["top_p"] == 0.95 and chat.max_tokens == 8  # nothing changed
    with pytest.raises(InvalidParameter):
        chat.handle("/set temperature nan")
    for line in ("/set top-k 5", "/set seed none", "/set repetition_penalty 1.1", "/set system Be kind."):
        assert chat.handle(line)
    assert chat.sampling["top_k"] == 5 and chat.sampling["seed"] is None and chat.chat.system == "Be kind."
    for line in ('/set dry_sequence_breakers ["\\n", "::"]', '/set logit_bias {"5": -100}', "/set mirostat 2",
                 "/set dry_multiplier 0.8"):  # every stage's settings; a list or a mapping as JSON
        assert chat.handle(line)
    assert chat.sampling["dry_sequence_breakers"] == ["\n", "::"] and chat.sampling["logit_bias"] == {5: -100}
    assert chat.sampling["mirostat"] == 2 and chat.sampling["dry_multiplier"] == 0.8
    with pytest.raises(InvalidParameter, match="dry_sequence_breakers\\[0\\] must be 1 to 40 characters"):
        chat.handle('/set dry_sequence_breakers [""]')
    assert chat.handle("/bye") is False


def test_load_rejects_what_is_not_a_conversation(checkpoint, chat_model_dir, tmp_path):
    chat, _ = session(checkpoint, chat_model_dir)
    cases = {
        "not json": "is not valid JSON",
        '{"messages": 3}': 'expected a list of messages or an object with "messages"',
        '[{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]':
            "messages[1] must be {role: user | assistant, content: a string}",
        '[{"role": "user", "content": 5}]': "messages[0] must be {role: system | user | assistant, content: a string}",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("|", r"\|")):
            chat.handle(f"/load {path}")
    assert chat.chat.turns == [] and chat.chat.system is None  # a bad file changes nothing
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]))
    chat.handle(f"/load {good}")
    assert chat.chat.system == "S" and chat.chat.turns == [{"role": "user", "content": "U"}]


def test_add_drops_whole_turns_and_refuses_a_message_that_cannot_fit(checkpoint):
    assert _oldest_turn_dropped([{"role": "user"}, {"role": "assistant"}, {"role": "user"}]) == [{"role": "user"}]
    chat = Conversation(checkpoint.chat_template, checkpoint.tokenizer, "sys")
    turns = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "first answer"},
             {"role": "user", "content": "two"}, {"role": "assistant", "content": "second answer"}]
    chat.turns = list(turns)
    message = {"role": "user", "content": "three"}
    whole = tokens(checkpoint, chat.messages(turns + [message]))
    kept = tokens(checkpoint, chat.messages(turns[2:] + [message]))
    ids, dropped, freed = chat.add(message, budget=kept)
    assert (len(ids), dropped, freed) == (kept, 1, whole - kept) and chat.turns == turns[2:] + [message]
    alone = tokens(checkpoint, chat.messages([{"role": "user", "content": "four"}]))
    with pytest.raises(ValueError, match=f"this message is {alone} tokens .*; {alone - 1} fit"):
        chat.add({"role": "user", "content": "four"}, budget=alone - 1)
    assert chat.turns == turns[2:] + [message]  # refused: the history is untouched


def test_startup_errors_are_one_line(checkpoint, chat_model_dir, tmp_path, capsys):
    plain = tmp_path / "plain"
    shutil.copytree(chat_model_dir, plain)
    (plain / "tokenizer_config.json").unlink()
    assert main(["chat", str(plain)]) == 2
    err = capsys.readouterr().err
    assert f"error: {plain} has no chat template" in err and err.count("\n") == 2  # loading line + error
    assert main(["chat", str(chat_model_dir), "--context", "64"]) == 2
    assert "error: max_tokens must be an integer in [1, 63] (room kept for the answer in the 64-token" \
        in capsys.readouterr().err


def test_printable_keeps_escape_sequences_off_the_terminal():
    assert printable("a\x1b[2Jb\tc\nd\x9b") == "a\\x1b[2Jb\tc\nd\\x9b"
