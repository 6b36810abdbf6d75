"""What ``serve-engine`` knows of the model's text: its end-of-sequence ids and tokenizer.

SGLang stops a request at the model's end-of-sequence token unless the request sets
``ignore_eos``, ends it at the first ``stop`` string in the decoded output, and answers
``text`` decoded with or without special tokens (``skip_special_tokens``, default on).
:class:`ModelText` holds what that needs, read from a Hugging Face model directory:
the ids of ``generation_config.json``'s ``eos_token_id`` and ``tokenizer_config.json``'s
``eos_token``, and ``tokenizer.json``. A server without one (the built-in character
model) stops only at the request's ``stop_token_ids`` and refuses ``stop`` strings.

Stop strings are found in the finished output: the engine decodes on, on device, to
the end-of-sequence token or ``max_new_tokens``, and the output is then cut after the
token that completed the first stop string (the token kept, as SGLang keeps it; the
string itself trimmed from ``text``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from tunix_agentic.inference.base import TokenOutput


def eos_token_ids(directory: str | Path, tokenizer: Any | None = None) -> tuple[int, ...]:
    """The end-of-sequence ids of a model directory: ``generation_config.json``'s
    ``eos_token_id`` (an id or a list), then ``tokenizer_config.json``'s ``eos_token``."""
    path = Path(directory)
    ids: list[int] = []
    generation = path / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        ids += [value] if isinstance(value, int) else [int(v) for v in value or []]
    config = path / "tokenizer_config.json"
    if config.is_file() and tokenizer is not None:
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        tid = tokenizer.token_to_id(eos) if isinstance(eos, str) else None
        if tid is not None:
            ids.append(int(tid))
    return tuple(dict.fromkeys(ids))


@dataclasses.dataclass(frozen=True)
class ModelText:
    """The model's end-of-sequence ids and (optionally) its ``tokenizers`` tokenizer."""

    eos_ids: tuple[int, ...] = ()
    tokenizer: Any | None = None

    @classmethod
    def from_dir(cls, directory: str | Path) -> ModelText:
        """Read a Hugging Face model directory (FileNotFoundError without tokenizer files)."""
        from tokenizers import Tokenizer

        path = Path(directory)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        tokenizer = Tokenizer.from_file(str(file))
        return cls(eos_ids=eos_token_ids(path, tokenizer), tokenizer=tokenizer)

    @classmethod
    def from_model_info(cls, info: dict[str, Any]) -> ModelText:
        """From a server's model info: ``tokenizer_path`` (a model directory) and/or
        ``eos_token_ids`` (which win over the directory's)."""
        text = cls.from_dir(info["tokenizer_path"]) if info.get("tokenizer_path") else cls()
        if info.get("eos_token_ids") is not None:
            text = dataclasses.replace(text, eos_ids=tuple(int(i) for i in info["eos_token_ids"]))
        return text

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str | None:
        """The text of ``ids`` (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


@dataclasses.dataclass(frozen=True)
class StopMatch:
    """An output cut at its first stop string."""

    output: TokenOutput
    matched: str


def cut_at_stop_string(
    out: TokenOutput, stops: tuple[str, ...], text: ModelText
) -> StopMatch | None:
    """``out`` cut after the token that completes the earliest stop string of ``stops`` in
    its decoded text (special tokens kept), or None when no stop string occurs."""
    if not stops or not out.token_ids or text.tokenizer is None:
        return None
    full = text.decode(out.token_ids, skip_special_tokens=False) or ""
    found = [(full.find(s), s) for s in stops if s and s in full]
    if not found:
        return None
    start, matched = min(found, key=lambda f: (f[0], -len(f[1])))
    end = start + len(matched)

    def holds(n: int) -> bool:  # whether the text of the first n tokens holds the match
        prefix = text.decode(out.token_ids[:n], skip_special_tokens=False) or ""
        return len(prefix) >= end and matched in prefix

    # The first such prefix, by bisection: log2(n) decodes, not n (a match at the end of a
    # 12,000-token reply took 16-21 s one prefix at a time). A longer prefix holds it too.
    lo, hi = 1, len(out.token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    n = lo
    cut = dataclasses.replace(
        out,
        token_ids=out.token_ids[:n],
        logprobs=out.logprobs[:n],
        versions=out.versions[:n],
        finish_reason="stop",
        matched_stop=None,
    )
    return StopMatch(output=cut, matched=matched)


# Outputs longer than this are cut off the event loop (decoding them takes milliseconds).
OFF_LOOP_TOKENS = 2048


async def cut_off_loop(
    out: TokenOutput, stops: tuple[str, ...], text: ModelText
) -> StopMatch | None:
    """:func:`cut_at_stop_string`, in a worker thread for a long output: a server's event
    loop keeps answering other clients meanwhile."""
    if not stops or len(out.token_ids) <= OFF_LOOP_TOKENS:
        return cut_at_stop_string(out, stops, text)
    return await asyncio.to_thread(cut_at_stop_string, out, stops, text)


def output_text(
    out: TokenOutput, text: ModelText, *, skip_special_tokens: bool, matched: str | None
) -> str | None:
    """SGLang's ``text`` of an output: decoded, the matched stop string trimmed off the end."""
    decoded = text.decode(out.token_ids, skip_special_tokens=skip_special_tokens)
    if decoded is None or matched is None:
        return decoded
    at = decoded.find(matched)
    return decoded[:at] if at >= 0 else decoded
