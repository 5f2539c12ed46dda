"""The CLI through its real entry points: tokenize, run, explain."""

from __future__ import annotations

import json
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
