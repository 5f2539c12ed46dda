"""The explainer's own computations: a session that steps through generation over a tree of
continuations, and the lesson's sections (embeddings, positions, attention, the logit lens, the
router of a mixture of experts, what each layer type keeps in the cache)."""
