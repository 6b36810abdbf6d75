"""A small character-level tokenizer for the built-in model.

Every printable ASCII character and newline is one token, the chat/tool
markers of the Qwen3 template (``<|im_start|>``, ``<tool_call>``, ...) are single
special tokens, and a few whole words of the chat roles and the tool-call JSON
are single tokens too (a tiny, fixed stand-in for BPE merges), so a tool call is
a handful of decisions rather than a spelling exercise and sequences stay short.
Encoding is greedy longest-match. Real checkpoints bring their own tokenizer; this one only has to be
exact and reversible: ``decode(encode(s)) == s`` for every string it accepts.
Text from outside the run (an OpenAI client's messages) may hold characters it lacks:
:meth:`CharTokenizer.fold` spells such text in the vocabulary first (whitespace to a space,
anything else to ``?``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
)
WORD_TOKENS: tuple[str, ...] = (
    "user",
    "assistant",
    "system",
    '{"name": "',
    '", "arguments": {',
    '"expression": "',
    '"}}',
    "calculator",
    "Compute ",
)
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
_FOREIGN = re.compile(r"[^\n\x20-\x7e]")  # every character outside _CHARS


class CharTokenizer:
    """Characters plus special tokens; ids are stable across versions.

    Special tokens take ids ``0..len(SPECIAL_TOKENS)-1``; characters follow,
    then the word tokens.
    Encoding text with a character outside printable ASCII raises ``ValueError``
    (silently dropping it would change what the model is trained on). Text the run does
    not own goes through :meth:`fold` first, which maps each such character to one that
    is in the vocabulary.
    """

    def __init__(self, vocab_size: int | None = None):
        self._id_to_token: list[str] = list(SPECIAL_TOKENS) + list(_CHARS) + list(WORD_TOKENS)
        natural = len(self._id_to_token)
        if vocab_size is not None and vocab_size < natural:
            raise ValueError(f"vocab_size={vocab_size} is below the {natural} tokens it needs")
        # Extra ids pad the embedding to a friendly size; they decode to "".
        self.vocab_size = vocab_size or natural
        self._token_to_id = {t: i for i, t in enumerate(self._id_to_token)}
        self._multi: dict[str, list[str]] = {}
        for token in sorted(SPECIAL_TOKENS + WORD_TOKENS, key=len, reverse=True):
            self._multi.setdefault(token[0], []).append(token)

    @property
    def pad_id(self) -> int:
        return self._token_to_id["<pad>"]

    @property
    def eos_id(self) -> int:
        return self._token_to_id["<|endoftext|>"]

    @property
    def im_end_id(self) -> int:
        return self._token_to_id["<|im_end|>"]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.im_end_id, self.eos_id)

    @property
    def tokens(self) -> list[str]:
        """Every token string, by id (the padding ids past the natural vocabulary excluded)."""
        return list(self._id_to_token)

    def token_id(self, token: str) -> int:
        """Id of one token (a special token or a single character)."""
        try:
            return self._token_to_id[token]
        except KeyError:
            raise ValueError(f"unknown token {token!r}") from None

    @staticmethod
    def fold(text: str) -> str:
        """``text`` spelled in this vocabulary, one character for one: a whitespace
        character it lacks (tab, carriage return, no-break space) becomes a space, any
        other character it lacks (non-ASCII such as ``é`` or an emoji, control characters)
        ``?``. So ``decode(encode(fold(s))) == fold(s)``, of the same length as ``s``. For
        text from outside the run: the OpenAI endpoint folds a client's conversation
        (frameworks put tabs and non-ASCII text in their prompts); the run's own tasks,
        tool outputs and demonstrations are encoded as they are, and refused if they hold
        such characters."""
        return _FOREIGN.sub(lambda m: " " if m.group().isspace() else "?", text)

    def encode(self, text: str) -> list[int]:
        """Text to ids; special-token strings become their single ids."""
        ids: list[int] = []
        i = 0
        n = len(text)
        while i < n:
            for token in self._multi.get(text[i], ()):
                if text.startswith(token, i):
                    ids.append(self._token_to_id[token])
                    i += len(token)
                    break
            else:
                tid = self._token_to_id.get(text[i])
                if tid is None:
                    raise ValueError(
                        f"character {text[i]!r} at offset {i} is not in the vocabulary"
                    )
                ids.append(tid)
                i += 1
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text; padding ids beyond the natural vocabulary decode to ''."""
        out = []
        for tid in ids:
            tid = int(tid)
            if not 0 <= tid < self.vocab_size:
                raise ValueError(f"token id {tid} outside vocabulary of {self.vocab_size}")
            if tid < len(self._id_to_token):
                out.append(self._id_to_token[tid])
        return "".join(out)

    def special_ids(self, tokens: Sequence[str] = SPECIAL_TOKENS) -> list[int]:
        return [self._token_to_id[t] for t in tokens]
