"""Weights from files into a model: where a checkpoint is (sources, bundled packages, the hub),
safetensors weights, GGUF files (gguf/), loading a whole checkpoint, and writing one (convert, export)."""
