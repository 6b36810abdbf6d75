"""The tokenizer interface: what the rest of the package may know of a tokenizer.

Two implement it: :class:`~tunix_agentic.models.char_tokenizer.CharTokenizer` (the
built-in model's) and :class:`~tunix_agentic.models.hf_tokenizer.HFTokenizer` (a Hugging
Face ``tokenizer.json`` from a model directory);
:func:`~tunix_agentic.models.tokenizers.load_tokenizer` picks one. Text from outside the
run goes through :func:`encode_client_text`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids, exactly: whatever the model saw is what the learner trains on."""

    vocab_size: int

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn (kept as the turn's last generated id)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Text to ids; special-token strings in the text become their single ids."""
        ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_id(self, token: str) -> int:
        """The id of one token string (ValueError if it is not a single token)."""
        ...


def encode_client_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of text a client sent (an OpenAI request's conversation): a tokenizer that cannot
    spell every character (the built-in one) folds the ones it lacks into ones it has
    (its ``fold``: see :meth:`~tunix_agentic.models.char_tokenizer.CharTokenizer.fold`)
    instead of refusing the request; any other encodes ``text`` as it is."""
    fold = getattr(tokenizer, "fold", None)
    return tokenizer.encode(text if fold is None else fold(text))
