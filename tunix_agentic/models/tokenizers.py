"""Which tokenizer a run uses: :func:`load_tokenizer` (the built-in characters, or a Hugging
Face directory's ``tokenizer.json``)."""

from __future__ import annotations

from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf_tokenizer import HFTokenizer
from tunix_agentic.models.tokenizer import Tokenizer


def load_tokenizer(
    source: str = "builtin", path: str = "", vocab_size: int | None = None
) -> Tokenizer:
    """The run's tokenizer: ``"builtin"`` (characters) or ``"hf"`` (``path``'s tokenizer.json)."""
    if source == "builtin":
        return CharTokenizer(vocab_size)
    if source == "hf":
        return HFTokenizer.from_dir(path, model_vocab_size=vocab_size)
    raise ValueError(f"tokenizer source must be 'builtin' or 'hf', got {source!r}")
