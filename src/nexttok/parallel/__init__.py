"""Tensor parallelism: one model split over several processes (model), their process group,
the split layers and KV cache, and the watch that ends a rank with its parent."""
