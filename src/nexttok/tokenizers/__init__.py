"""Text → token ids and back: normalizers, pre_tokenizers, the BPE merges, decoders and the
incremental detokenizer, read from a tokenizer.json (from_json) — HF tokenizers' own cut — and the
chat template that turns messages into the text a model reads."""
