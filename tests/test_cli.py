"""`nexttok tokenize` through the real entry points."""

from __future__ import annotations

import json
import subprocess
import sys

from nexttok.cli import main


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
