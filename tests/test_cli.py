"""The CLI through its real entry points: tokenize, run, explain."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from nexttok.cli import main
from tiny_models import write_tiny_with_gpt2_tokenizer


def test_tokenize_json(capsys, gpt2):
    assert main(["tokenize", "gpt2", "The capital of France is Paris.", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ids"] == gpt2.encode("The capital of France is Paris.")
    assert record["pieces"] == ["The", " capital", " of", " France", " is", " Paris", "."]
    assert record["count"] == 7


def test_tokenize_table(capsys):
    assert main(["tokenize", "gpt2", "hi <|endoftext|>"]) == 0
    out = capsys.readouterr().out
    assert "50256" in out and "<|endoftext|>" in out and "3 tokens" in out


def test_tokenize_options(capsys, variant_files):
    path = str(variant_files["llama3"])
    assert main(["tokenize", path, "<|endoftext|>", "--json", "--no-special"]) == 0
    plain = json.loads(capsys.readouterr().out)["ids"]
    assert len(plain) > 1
    assert main(["tokenize", path, "x", "--json", "--add-special"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ids"]) == 2


def test_tokenize_stdin_via_module():
    result = subprocess.run(
        [sys.executable, "-m", "nexttok", "tokenize", "gpt2", "-", "--json"],
        input="héllo\n", capture_output=True, text=True, check=True,
    )
    record = json.loads(result.stdout)
    assert "".join(record["pieces"]) == "héllo\n"


def test_tokenize_error_is_clear(capsys, tmp_path):
    assert main(["tokenize", str(tmp_path), "x"]) == 2
    assert "no tokenizer in" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, gpt2_dir):
    directory = tmp_path_factory.mktemp("tiny_gpt2_vocab")
    write_tiny_with_gpt2_tokenizer("llama_gqa_llama3_rope", directory, gpt2_dir)
    return directory


def test_run_streams_and_reports_speed(capsys, tiny_dir, gpt2):
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.loop import generate
    from nexttok.generation.sampling import SamplingParams

    assert main(["run", str(tiny_dir), "The capital of France is", "--seed", "3", "--max-tokens", "8"]) == 0
    captured = capsys.readouterr()
    checkpoint = load_checkpoint(tiny_dir)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)
    expected = generate(model, tokenizer, "The capital of France is", params, max_tokens=8)
    assert captured.out == expected.text + "\n"
    assert "tokens/s" in captured.err and "first token" in captured.err


def test_run_json_and_no_cache_agree(capsys, tiny_dir):
    args = ["run", str(tiny_dir), "Hello", "--temperature", "0", "--max-tokens", "5", "--json"]
    assert main(args) == 0
    cached = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main([*args, "--no-cache"]) == 0
    uncached = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["token_id"] for r in cached] == [r["token_id"] for r in uncached]
    assert len(cached) == 5 and cached[-1]["finish_reason"] == "length"
    assert {"logprob", "rank", "top", "top_filtered", "elapsed", "text"} <= set(cached[0])


def test_explain_shows_tables(capsys, tiny_dir):
    assert main(["explain", str(tiny_dir), "The capital of France is", "--steps", "2", "--top", "4",
                 "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("step ") >= 2 and "everything else" in out and "tokens kept: raw 50257" in out
    assert "entropy" in out and "␣capital" in out


LONG_PROMPT = "word " * 250  # leaves a few of the tiny model's 256 positions


@pytest.mark.parametrize(("command", "flag"), [("explain", "--steps"), ("run", "--max-tokens")])
def test_a_length_past_the_context_window_stops_there_and_says_so(capsys, tiny_dir, command, flag):
    """explain --steps 1000000000 went on, a table a step, to the end of the context window without
    a word; it stops there as run's --max-tokens does, and both say so before they start."""
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.loop import prompt_ids_for

    checkpoint = load_checkpoint(tiny_dir)
    prompt = len(prompt_ids_for(checkpoint.model, checkpoint.tokenizer, LONG_PROMPT))
    room = checkpoint.model.config.max_position_embeddings - prompt
    assert 0 < room < 10
    extra = ["--json"] if command == "run" else []
    assert main([command, str(tiny_dir), LONG_PROMPT, flag, "1000000000", "--temperature", "0", *extra]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (f"note: {flag} 1000000000 is past the context window (256 tokens, "
                                            f"{prompt} of them the prompt's): stopping after {room}")
    if command == "explain":
        assert captured.out.count("\nstep ") == room and f"step {room}: after" in captured.out
    else:
        steps = [json.loads(line) for line in captured.out.splitlines()]
        assert len(steps) == room and steps[-1]["finish_reason"] == "length"
    assert main([command, str(tiny_dir), LONG_PROMPT, flag, str(room), "--temperature", "0", *extra]) == 0
    assert "note:" not in capsys.readouterr().err  # a length that fits says nothing


@pytest.mark.parametrize("args,message", [
    (["--temperature", "-1"], "temperature must be a number >= 0"),
    (["--top-p", "0"], "top_p must be in"),
    (["--max-tokens", "0"], "max_tokens must be an integer >= 1"),
    (["--temperature", "inf"], "temperature must be a number >= 0, got inf"),
    (["--top-p", "nan"], "top_p must be in"),
    (["--min-p=-inf"], "min_p must be in"),
])
def test_run_bad_values(capsys, tiny_dir, args, message):
    assert main(["run", str(tiny_dir), "x", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["run", "explain"])
def test_sampling_values_are_checked_before_the_model_loads(capsys, monkeypatch, command):
    """A user waited 7 s of loading to learn that --temperature was wrong."""
    from nexttok.cli import common

    monkeypatch.setattr(common, "load", lambda *a: pytest.fail("the model was loaded first"))
    assert main([command, "default", "x", "--temperature", "inf"]) == 2
    assert "temperature must be" in capsys.readouterr().err


def test_hostile_inputs_get_one_line_errors(capsys, tiny_dir, tmp_path):
    cases = [(["run", str(tmp_path / "missing.gguf"), "x"], f"no such GGUF file: {tmp_path / 'missing.gguf'}"),
             (["run", str(tiny_dir), "x", "--device", "cuda"], "device 'cuda' is not available")]
    import torch

    for argv, message in cases[: 2 if not torch.cuda.is_available() else 1]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    result = subprocess.run([sys.executable, "-m", "nexttok", "run", str(tiny_dir), "-"], input=b"ok \xff\xfe",
                            capture_output=True)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "error: standard input is not valid UTF-8 (byte 3: b'\\xff')"


@pytest.mark.parametrize("command", ["tokenize", "run", "chat", "explain", "neighbors", "serve", "bench", "models",
                                     "convert", "pull", "list", "rm", "cp"])
def test_every_help_prints(capsys, command):
    """argparse formats help with %: a bare % in a help text crashed `serve --help`."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and "usage: nexttok" in capsys.readouterr().out


def _sampling_flags(parser) -> dict[str, str]:
    """The parser's sampling flags: option string -> the SamplingParams field it sets."""
    from nexttok.generation.stages import SETTINGS

    return {option: action.dest for action in parser._actions for option in action.option_strings
            if action.dest in SETTINGS or action.dest == "seed"}


def test_run_and_chat_take_the_same_sampling_flags():
    """One flag per setting of every stage, the same on both commands (they had drifted), and a
    value given on either reaches the same SamplingParams."""
    from nexttok.cli import build_parser, common
    from nexttok.generation.stages import SETTINGS

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    run, chat = _sampling_flags(commands["run"]), _sampling_flags(commands["chat"])
    assert run == chat
    assert sorted(set(run.values())) == sorted([*SETTINGS, "seed"])
    assert {"--presence-penalty", "--frequency-penalty", "--repetition-penalty", "--logit-bias"} <= set(run)
    flags = ["--presence-penalty", "0.5", "--frequency-penalty", "0.25", "--repeat-last-n", "32",
             "--logit-bias", "5=-100", "--logit-bias", "7=2.5", "--top-k", "12", "--seed", "9"]
    from_run = common.sampling_params(commands["run"].parse_args([*flags, "model", "prompt"]))
    from_chat = common.sampling_params(commands["chat"].parse_args([*flags, "model"]))
    assert from_run == from_chat
    assert (from_run.presence_penalty, from_run.frequency_penalty, from_run.repeat_last_n) == (0.5, 0.25, 32)
    assert from_run.logit_bias == {5: -100.0, 7: 2.5} and from_run.top_k == 12 and from_run.seed == 9


@pytest.mark.parametrize("args,message", [
    (["--logit-bias", "5"], "--logit-bias takes ID=BIAS (e.g. 50256=-100), got '5'"),
    (["--logit-bias", "5=-300"], "logit_bias[5] must be in [-100, 100], got -300.0"),
    (["--repeat-last-n", "-2"], "repeat_last_n must be an integer >= -1, got -2"),
    (["--presence-penalty", "3"], "presence_penalty must be in [-2, 2], got 3.0"),
])
@pytest.mark.parametrize("command", ["run", "chat"])
def test_bad_sampling_flags_are_one_line_naming_the_setting(capsys, command, args, message):
    argv = [command, "default", "x", *args] if command == "run" else [command, "default", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_run_as_a_process_ends_with_its_output_whole(tiny_dir, tmp_path):
    """`python -m nexttok run` ends without the interpreter's teardown (cli.entry): the text, the summary
    line and the trace are whole all the same, and the trace replays; a reader that stops early
    (`| head -c 1`) ends it with status 0 and no error line."""
    trace = tmp_path / "run.jsonl"
    command = [sys.executable, "-m", "nexttok", "run", str(tiny_dir), "Hello", "--temperature", "0",
               "--max-tokens", "6", "--no-server"]
    result = subprocess.run([*command, "--trace", str(trace)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stdout.strip()
    assert "6 tokens (length)" in result.stderr
    lines = trace.read_text().splitlines()
    assert len(lines) == 8 and '"end"' in lines[-1]  # header, 6 steps, end
    assert main(["replay", str(trace)]) == 0
    piped = subprocess.run(f"{shlex.join(command)} --max-tokens 2000 | head -c 1", shell=True,
                           capture_output=True, text=True, timeout=120)
    assert len(piped.stdout) == 1 and "error" not in piped.stderr, piped.stderr
