"""What a bad checkpoint raises (config.py re-exports both)."""


class ConfigError(ValueError):
    """config.json asks for something missing, malformed or unsupported."""


class CheckpointError(ValueError):
    """A checkpoint file that is missing, corrupt, or does not fit the model."""
