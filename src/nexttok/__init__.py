"""nexttok: an LLM text-generation engine that shows every step."""

from nexttok.checkpoints.sources import load_tokenizer
from nexttok.tokenizers.detokenizer import IncrementalDetokenizer
from nexttok.tokenizers.tokenizer import Tokenizer, TokenizerError

__all__ = ["IncrementalDetokenizer", "Tokenizer", "TokenizerError", "load_tokenizer"]
__version__ = "0.1.0"
