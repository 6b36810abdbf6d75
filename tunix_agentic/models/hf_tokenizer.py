"""A Hugging Face tokenizer from a model directory, behind the package's Tokenizer interface.

Reads ``tokenizer.json`` with the ``tokenizers`` library, the special tokens
and chat template from ``tokenizer_config.json`` (or ``chat_template.jinja``),
and the end-of-turn ids from ``generation_config.json``. Text is encoded
without adding special tokens: the chat template writes every marker itself.

:func:`save_char_tokenizer` writes the built-in character tokenizer in the same
format (same ids, same greedy longest-match on its special and word tokens),
so a model trained here can be exported with a tokenizer transformers loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tunix_agentic.models.char_tokenizer import SPECIAL_TOKENS, WORD_TOKENS, CharTokenizer


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(config: dict[str, Any], directory: Path) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template


class HFTokenizer:
    """``tokenizer.json`` + ``tokenizer_config.json`` of a model directory."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        eos_token: str,
        pad_token: str | None = None,
        bos_token: str | None = None,
        chat_template: str | None = None,
        extra_stop_ids: Iterable[int] = (),
        path: str | None = None,
        model_vocab_size: int | None = None,
    ):
        self._tok = tokenizer
        self.path = path
        # Models often pad their embedding past the tokenizer's vocabulary (Qwen3: 151,936
        # rows for 151,669 tokens); those ids decode to "" as the built-in's padding does.
        self.text_vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.vocab_size = max(self.text_vocab_size, model_vocab_size or 0)
        self.eos_token, self.bos_token = eos_token, bos_token
        self.chat_template = chat_template
        self._eos_id = self.token_id(eos_token)
        self._pad_id = self.token_id(pad_token) if pad_token else self._eos_id
        stops = [self._eos_id, *(int(i) for i in extra_stop_ids)]
        self._stop_ids = tuple(dict.fromkeys(stops))

    @classmethod
    def from_dir(cls, path: str | Path, *, model_vocab_size: int | None = None) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{directory} has no tokenizer.json")
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        eos = _token_text(config.get("eos_token"))
        if eos is None:
            raise ValueError(f"{config_file}: no eos_token (the end of an assistant turn)")
        extra: list[int] = []
        generation = directory / "generation_config.json"
        if generation.is_file():
            ids = json.loads(generation.read_text()).get("eos_token_id")
            extra = [ids] if isinstance(ids, int) else list(ids or [])
        return cls(
            RustTokenizer.from_file(str(file)),
            eos_token=eos,
            pad_token=_token_text(config.get("pad_token")),
            bos_token=_token_text(config.get("bos_token")),
            chat_template=_chat_template(config, directory),
            extra_stop_ids=extra,
            path=str(directory),
            model_vocab_size=model_vocab_size,
        )

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._stop_ids

    def token_id(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"unknown token {token!r}")
        return int(tid)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside vocabulary of {self.vocab_size}")
        text_ids = [i for i in ids if i < self.text_vocab_size]
        return self._tok.decode(text_ids, skip_special_tokens=False)


def save_char_tokenizer(tok: CharTokenizer, out_dir: str | Path, *, chat_template: str) -> Path:
    """Write ``tok`` as ``tokenizer.json`` + ``tokenizer_config.json`` under ``out_dir``.

    Every character is a word of a WordLevel model (each character split off by
    the pre-tokenizer); the special and word tokens are added tokens, which the
    library matches leftmost-longest before splitting, as the built-in does.
    """
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(tok.tokens)}
    rust = RustTokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    rust.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    rust.decoder = decoders.Fuse()
    rust.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    rust.add_tokens([AddedToken(t, special=False, normalized=False) for t in WORD_TOKENS])
    rust.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",
        "chat_template": chat_template,
        "model_max_length": 1_000_000,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    stops = {"eos_token_id": [tok.im_end_id, tok.eos_id]}
    (out / "generation_config.json").write_text(json.dumps(stops, indent=2))
    return out
