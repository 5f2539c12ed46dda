"""The lesson in the terminal: `explain --lens`, `explain --attention`, `neighbors` print the lesson
functions' numbers."""

from __future__ import annotations

import re

import pytest

from nexttok.checkpoints.loading import load_model
from nexttok.cli import main
from nexttok.lesson import sections as lesson
from nexttok.tokenizers.from_json import from_directory
from tiny_models import write_tiny_with_gpt2_tokenizer

PROMPT = "The king and the queen"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, gpt2_dir):
    directory = tmp_path_factory.mktemp("tiny_lesson_cli")
    write_tiny_with_gpt2_tokenizer("llama_gqa_llama3_rope", directory, gpt2_dir)
    return directory, load_model(directory), from_directory(directory)


def test_explain_lens_and_attention(capsys, tiny):
    directory, model, tokenizer = tiny
    argv = ["explain", str(directory), PROMPT, "--steps", "1", "--temperature", "0", "--lens", "--attention", "1:2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    ids = tokenizer.encode(PROMPT)
    view = lesson.lens(model, tokenizer, lesson.inspect(model, ids), -1, 3)
    rows = re.findall(r"│\s+(embed|\d+) │.*?│\s+([\d.]+)% │\s+(\d+) │", out)
    assert [r[0] for r in rows] == ["embed", "1", "2"]
    assert [float(r[1]) for r in rows] == pytest.approx([100 * layer["final_p"] for layer in view["layers"]],
                                                          abs=0.006)
    assert [int(r[2]) for r in rows] == [layer["final_rank"] for layer in view["layers"]]
    assert "attention, layer 1, head 2" in out
    generated = ids + [view["final"]["id"]]
    assert len(re.findall(r"^│\s+\d+ \S+ ?│", out, flags=re.M)) == len(generated)  # one heatmap row per token


def test_neighbors(capsys, tiny):
    directory, model, tokenizer = tiny
    assert main(["neighbors", "king", "queen", "apple", "--model", str(directory), "-k", "4"]) == 0
    out = capsys.readouterr().out
    ids, vector = lesson.word_vector(model, tokenizer, "king")
    expected = lesson.neighbors(model, vector, 4, exclude=ids)
    first = out.split("nearest to 'queen'")[0]
    assert [int(i) for i in re.findall(r"│\s+(\d+) │\s+-?[\d.]+ │", first)] == [i for i, _ in expected]
    assert "cosine similarity of the words' embeddings" in out


@pytest.mark.parametrize("argv, message", [
    (["explain", "x", "--attention", "one"], "--attention takes LAYER or LAYER:HEAD"),
    (["neighbors", " ", "--model", "nowhere"], "a word must be 1 to 64 characters"),
    (["neighbors", "king", "-k", "0"], "-k must be in 1..100"),
])
def test_bad_values_before_loading(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
