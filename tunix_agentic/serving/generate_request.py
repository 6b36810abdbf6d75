"""The body of ``POST /generate`` (SGLang's native API), checked by pydantic models.

:func:`parse_generate` turns a JSON body into :class:`GenerateRequest`\\ s (one per prompt;
a batch is all or nothing), :func:`parse_sampling_params` and :func:`parse_text_options`
read SGLang's ``sampling_params``, :func:`parse_version` a weight version. Every error is
a ValueError naming the field (HTTP 400 at the server; :mod:`.validation` words it); a
prompt with no room left in the context window is a
:class:`~tunix_agentic.inference.base.PromptTooLongError`. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictInt, TypeAdapter

from tunix_agentic.inference.base import PromptTooLongError
from tunix_agentic.inference.constraint import Constraint
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.serving.validation import NonEmpty, Strict, validate

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


def _whole(value: Any) -> Any:
    # SGLang (lax) takes 5.0 for 5; 5.5, nan and inf stay floats, refused as no integer.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int_text(value: Any) -> Any:
    try:  # SGLang sends weight versions as strings
        return int(value) if isinstance(value, str) else value
    except ValueError:
        return value  # refused as no integer


Whole = Annotated[int, BeforeValidator(_whole)]
_TOKENS = TypeAdapter(Annotated[list[StrictInt], Field(min_length=1, fail_fast=True)])
_VERSION = TypeAdapter(Annotated[StrictInt, BeforeValidator(_int_text)])


class _Sampling(Strict, extra="allow"):
    """SGLang ``sampling_params``: what we implement. Other keys are ignored (kept for
    ``Constraint.from_sglang``, which reads its own)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: Whole | None = None
    max_new_tokens: Whole | None = None
    stop_token_ids: list[Whole] | None = None
    sampling_seed: Whole | None = None
    seed: Whole | None = None
    ignore_eos: bool = False
    stop: NonEmpty | list[NonEmpty] | None = None
    skip_special_tokens: bool = True

    def params(
        self, *, max_seq_len: int, vocab_size: int, eos_ids: tuple[int, ...]
    ) -> SamplingParams:
        given = self.model_fields_set
        kw = {
            k: v for k in ("temperature", "top_p", "top_k") if (v := getattr(self, k)) is not None
        }
        if self.top_k == -1:
            kw["top_k"] = 0
        if "max_new_tokens" in given:
            value = self.max_new_tokens  # null: to the context window
            kw["max_new_tokens"] = max_seq_len if value is None else value
        stops = tuple(self.stop_token_ids or ())
        if eos_ids and not self.ignore_eos:
            stops = tuple(dict.fromkeys((*stops, *eos_ids)))
        params = SamplingParams(
            **kw,
            stop_token_ids=stops,
            seed=self.sampling_seed if "sampling_seed" in given else self.seed,
            constraint=Constraint.from_sglang(self.model_extra or {}),
        )
        params.check_vocab(vocab_size)
        return params

    def text_options(self, *, can_decode: bool) -> tuple[tuple[str, ...], bool]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if stops and not can_decode:
            raise ValueError(
                "stop strings need the model's tokenizer; this server has none (serve a "
                "Hugging Face model directory, or use stop_token_ids)"
            )
        return stops, self.skip_special_tokens


class _Options(Strict):
    """What a ``/generate`` body says of one prompt besides its token ids."""

    sampling_params: _Sampling | None
    rid: str | None
    session_id: str | None
    return_logprob: bool


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
    sampling = validate(_Sampling, {} if raw is None else raw, root="sampling_params", sep=" ")
    return sampling.params(max_seq_len=max_seq_len, vocab_size=vocab_size, eos_ids=eos_ids)


def parse_text_options(raw: Any, *, can_decode: bool) -> tuple[tuple[str, ...], bool]:
    """``(stop strings, skip_special_tokens)`` of SGLang ``sampling_params``: ``stop`` is a
    string or a list of them; ``skip_special_tokens`` defaults to true. Stop strings need
    the model's tokenizer (``can_decode``); ValueError naming the field otherwise."""
    if not isinstance(raw, dict):
        return (), True
    sampling = validate(_Sampling, raw, root="sampling_params", sep=" ")
    return sampling.text_options(can_decode=can_decode)


def _prompt(raw: Any, *, vocab_size: int, max_seq_len: int, where: str) -> list[int]:
    ids = validate(_TOKENS, raw, root=where, sep=" ")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"{where}: token ids must be in [0, {vocab_size})")
    if len(ids) >= max_seq_len:
        raise PromptTooLongError(
            f"{where}: prompt of {len(ids)} tokens leaves no room within max_seq_len={max_seq_len}"
        )
    return ids


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
    rids = body.get("rid")
    if batched and isinstance(rids, str):
        rids = [f"{rids}-{i}" for i in range(n)]
    per_prompt = {
        "sampling_params": _per_prompt(body.get("sampling_params"), n, "sampling_params"),
        "rid": _per_prompt(rids, n, "rid"),
        "session_id": _per_prompt(body.get("session_id"), n, "session_id"),
        "return_logprob": _per_prompt(body.get("return_logprob", False), n, "return_logprob"),
    }
    out = []
    for i in range(n):
        where = f"input_ids[{i}]" if batched else "input_ids"
        opts = validate(_Options, {k: v[i] for k, v in per_prompt.items()}, sep=" ")
        sampling = opts.sampling_params or _Sampling()
        stops, skip_special = sampling.text_options(can_decode=can_decode)
        out.append(
            GenerateRequest(
                input_ids=_prompt(
                    prompts[i], vocab_size=vocab_size, max_seq_len=max_seq_len, where=where
                ),
                sampling=sampling.params(
                    max_seq_len=max_seq_len, vocab_size=vocab_size, eos_ids=eos_ids
                ),
                rid=opts.rid if opts.rid is not None else new_rid(),
                session_id=opts.session_id,
                return_logprob=opts.return_logprob,
                stop=stops,
                skip_special_tokens=skip_special,
            )
        )
    return out, batched


def parse_version(raw: Any, *, default: int) -> int:
    """A weight version: an integer or a string of one (SGLang sends strings)."""
    return default if raw is None else validate(_VERSION, raw, root="weight_version", sep=" ")
