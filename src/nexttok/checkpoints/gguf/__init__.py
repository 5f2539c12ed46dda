"""llama.cpp's GGUF files: the metadata and tensor index (reader, metadata), quantized blocks,
the tokenizer they carry, and their tensors into nexttok's layers (weights)."""
