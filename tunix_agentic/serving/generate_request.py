"""The body of ``POST /generate`` (SGLang's native API), checked field by field.

:func:`parse_generate` turns a JSON body into :class:`GenerateRequest`\\ s (one per prompt;
a batch is all or nothing), :func:`parse_sampling_params` and :func:`parse_text_options`
read SGLang's ``sampling_params``, :func:`parse_version` a weight version. Every error is
a ValueError naming the field (HTTP 400 at the server); a prompt with no room left in the
context window is a :class:`~tunix_agentic.inference.base.PromptTooLongError`.
Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tunix_agentic.inference.base import PromptTooLongError
from tunix_agentic.inference.constraint import Constraint
from tunix_agentic.inference.params import SamplingParams

MAX_PROMPTS_PER_REQUEST = 1024
MAX_TOKENS_PER_REQUEST = 4 * 1024 * 1024  # prompt tokens summed over a request's prompts


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One prompt of a ``/generate`` body, validated."""

    input_ids: list[int]
    sampling: SamplingParams
    rid: str
    session_id: str | None
    return_logprob: bool
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():  # nan and inf included
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        raise ValueError(f"{name} must be a finite number, got {value!r}") from None


def parse_sampling_params(
    raw: Any, *, max_seq_len: int, vocab_size: int, eos_ids: tuple[int, ...] = ()
) -> SamplingParams:
    """SGLang ``sampling_params`` -> :class:`SamplingParams`.

    Missing keys keep the defaults (SGLang's: temperature 1, top_p 1, top_k off,
    128 new tokens); ``top_k`` -1 or 0 is off; ``max_new_tokens: null`` runs to
    the context window; ``sampling_seed`` (or ``seed``) seeds the request.
    The model's ``eos_ids`` join ``stop_token_ids`` unless ``ignore_eos`` is true.
    ``json_schema``, ``regex``, ``ebnf`` or ``structural_tag`` (at most one) constrain the
    output (:class:`~tunix_agentic.inference.constraint.Constraint`).
    ``stop`` and ``skip_special_tokens`` are read by :func:`parse_text_options`;
    other keys we do not implement are ignored. Bad values (out of range, or beyond
    what a ``vocab_size`` model can do) raise ValueError naming the field.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"sampling_params must be an object, got {raw!r}")
    kw: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if raw.get(name) is not None:
            kw[name] = _number(raw[name], name)
    if raw.get("top_k") is not None:
        top_k = _integer(raw["top_k"], "top_k")
        kw["top_k"] = 0 if top_k == -1 else top_k
    if "max_new_tokens" in raw:
        value = raw["max_new_tokens"]
        kw["max_new_tokens"] = max_seq_len if value is None else _integer(value, "max_new_tokens")
    stops = raw.get("stop_token_ids")
    if stops is not None:
        if not isinstance(stops, list):
            raise ValueError(f"stop_token_ids must be a list of integers, got {stops!r}")
        kw["stop_token_ids"] = tuple(_integer(t, "stop_token_ids[]") for t in stops)
    seed = raw.get("sampling_seed", raw.get("seed"))
    if seed is not None:
        kw["seed"] = _integer(seed, "sampling_seed")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"ignore_eos must be true or false, got {ignore_eos!r}")
    if eos_ids and not ignore_eos:
        kw["stop_token_ids"] = tuple(dict.fromkeys((*kw.get("stop_token_ids", ()), *eos_ids)))
    kw["constraint"] = Constraint.from_sglang(raw)  # json_schema / regex / ebnf / structural_tag
    params = SamplingParams(**kw)
    params.check_vocab(vocab_size)
    return params


def parse_text_options(raw: Any, *, can_decode: bool) -> tuple[tuple[str, ...], bool]:
    """``(stop strings, skip_special_tokens)`` of SGLang ``sampling_params``: ``stop`` is a
    string or a list of them; ``skip_special_tokens`` defaults to true. Stop strings need
    the model's tokenizer (``can_decode``); ValueError naming the field otherwise."""
    if not isinstance(raw, dict):
        return (), True
    stop = raw.get("stop")
    stops: tuple[str, ...] = ()
    if stop is not None:
        stops = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        stops = tuple(stops)
        if stops and not can_decode:
            raise ValueError(
                "stop strings need the model's tokenizer; this server has none (serve a "
                "Hugging Face model directory, or use stop_token_ids)"
            )
    skip = raw.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise ValueError(f"skip_special_tokens must be true or false, got {skip!r}")
    return stops, skip


def _prompt(raw: Any, *, vocab_size: int, max_seq_len: int, where: str) -> list[int]:
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where} must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raise ValueError(f"{where} must hold integers only")
    if min(raw) < 0 or max(raw) >= vocab_size:
        raise ValueError(f"{where}: token ids must be in [0, {vocab_size})")
    if len(raw) >= max_seq_len:
        raise PromptTooLongError(
            f"{where}: prompt of {len(raw)} tokens leaves no room within max_seq_len={max_seq_len}"
        )
    return raw


def _per_prompt(raw: Any, n: int, name: str) -> list[Any]:
    """A batch field given once for all prompts or as a list with one per prompt."""
    if isinstance(raw, list):
        if len(raw) != n:
            raise ValueError(f"{name} has {len(raw)} entries for {n} prompts")
        return raw
    return [raw] * n


def parse_generate(
    body: Any,
    *,
    vocab_size: int,
    max_seq_len: int,
    new_rid: Callable[[], str],
    max_prompts: int = MAX_PROMPTS_PER_REQUEST,
    max_tokens: int = MAX_TOKENS_PER_REQUEST,
    eos_ids: tuple[int, ...] = (),
    can_decode: bool = False,
) -> tuple[list[GenerateRequest], bool]:
    """Validate a ``/generate`` body; returns ``(requests, batched)``.

    Everything is checked before anything runs, so a batch is all or nothing.
    Raises ValueError (HTTP 400) naming what is wrong.
    """
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    ids = body.get("input_ids")
    if ids is None:
        if "text" in body:
            raise ValueError("this server takes input_ids only (it has no tokenizer)")
        raise ValueError("input_ids is required")
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    n = len(prompts)
    if n > max_prompts:
        raise ValueError(f"input_ids holds {n} prompts; this server takes at most {max_prompts}")
    total = sum(len(p) if isinstance(p, list) else 0 for p in prompts)
    if total > max_tokens:
        raise ValueError(
            f"input_ids holds {total} tokens; this server takes at most {max_tokens} per request"
        )
    sampling = _per_prompt(body.get("sampling_params"), n, "sampling_params")
    rids = body.get("rid")
    if batched and isinstance(rids, str):
        rids = [f"{rids}-{i}" for i in range(n)]
    rids = _per_prompt(rids, n, "rid")
    sessions = _per_prompt(body.get("session_id"), n, "session_id")
    logprob_flags = _per_prompt(body.get("return_logprob", False), n, "return_logprob")
    if not all(isinstance(flag, bool) for flag in logprob_flags):
        raise ValueError(f"return_logprob must be true or false, got {body['return_logprob']!r}")
    out = []
    for i in range(n):
        where = f"input_ids[{i}]" if batched else "input_ids"
        rid, session = rids[i], sessions[i]
        if rid is not None and not isinstance(rid, str):
            raise ValueError(f"rid must be a string, got {rid!r}")
        if session is not None and not isinstance(session, str):
            raise ValueError(f"session_id must be a string, got {session!r}")
        stops, skip_special = parse_text_options(sampling[i], can_decode=can_decode)
        out.append(
            GenerateRequest(
                input_ids=_prompt(
                    prompts[i], vocab_size=vocab_size, max_seq_len=max_seq_len, where=where
                ),
                sampling=parse_sampling_params(
                    sampling[i], max_seq_len=max_seq_len, vocab_size=vocab_size, eos_ids=eos_ids
                ),
                rid=rid if rid is not None else new_rid(),
                session_id=session,
                return_logprob=logprob_flags[i],
                stop=stops,
                skip_special_tokens=skip_special,
            )
        )
    return out, batched


def parse_version(raw: Any, *, default: int) -> int:
    """A weight version: an integer or a string of one (SGLang sends strings)."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        raise ValueError(f"weight_version must be an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"weight_version must be an integer, got {raw!r}")
