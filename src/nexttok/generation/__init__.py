"""From logits to text: the autoregressive loop (loop), the sampler chain and its parameters,
grammar constraints, tool calls, and prompt scores."""
