"""``VLLMEngine``: the engine interface over a real vLLM server (token in, token out).

It speaks vLLM's own token API, ``POST /inference/v1/generate`` (``token_ids`` in; the
sampled ``token_ids``, their logprobs, the finish reason and which weight version made
each token out), so nothing is detokenised or re-tokenised on the way. The server must be
started with ``--enable-scale-out`` (that route), ``--logprobs-mode processed_logprobs``
(logprobs of the temperature-scaled distribution, as our engine and learner compute them;
vLLM's default is the logits before temperature) and ``VLLM_SERVER_DEV_MODE=1`` (the
weight routes); :func:`tunix_agentic.serving.vllm_server.vllm_command` builds that command,
``tunix-agentic serve-vllm`` runs it.

Weights reach the server through a directory it can read, as with SGLang: the client
writes Hugging Face safetensors (only the tensors, named as ``model_cfg`` names them), then
pauses the server keeping its requests (``/pause?mode=keep``), has every worker reload
in place (``/collective_rpc`` ``reload_weights``), drops the prefix cache, sets the weight
version and resumes. Requests in flight are frozen, not dropped: they finish on the new
weights, and the reply's ``weight_versions`` say which tokens each version sampled (their
KV from before the switch is kept, as our engine keeps a running request's). Errors are
sorted as :class:`~tunix_agentic.serving.client.SGLangEngine` sorts them.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from tunix_agentic.inference.base import (
    EngineError,
    PromptTooLongError,
    TokenCallback,
    TokenOutput,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.serving.client import (
    _ABORT_TIMEOUT_S,
    BadReply,
    SGLangEngine,
    _as_int,
    _error_message,
    check_reply,
    versions_of,
)

# vLLM's own prefix on the id of a request made through /inference/v1/generate: an abort
# must name it (the bare id is silently ignored).
REQUEST_PREFIX = "generate-tokens-"
# What vLLM answers (HTTP 400) for a prompt longer than its --max-model-len.
_TOO_LONG = re.compile(r"longer than the maximum model length")
# Our constraint kinds -> the field of vLLM's ``structured_outputs`` that takes them.
_STRUCTURED = {"json_schema": "json", "regex": "regex", "ebnf": "grammar",
               "structural_tag": "structural_tag"}  # fmt: skip


def vllm_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """vLLM ``sampling_params`` with our semantics: stop only on ``stop_token_ids`` (the
    stop token kept in the output, as vLLM keeps it), the sampled token's logprob, no
    detokenising, and every penalty off (set explicitly: a server started without
    ``--generation-config vllm`` would otherwise apply the model's defaults)."""
    out: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,  # 0: off, in vLLM as here
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if sampling.seed is not None:
        out["seed"] = sampling.seed
    if sampling.constraint is not None:
        c = sampling.constraint
        out["structured_outputs"] = {_STRUCTURED[c.kind]: c.value}
    return out


def parse_vllm_response(
    body: Any,
    *,
    default_version: int = 0,
    stop_token_ids: tuple[int, ...] = (),
    vocab_size: int | None = None,
    max_version: int | None = None,
    versioned: bool = False,
) -> TokenOutput:
    """A vLLM ``/inference/v1/generate`` answer -> :class:`TokenOutput`; EngineError if
    malformed, :class:`~tunix_agentic.serving.client.BadReply` if impossible.

    Per-token versions come from the choice's ``weight_versions`` spans (labels that are
    not integers, vLLM's ``"default"``, count as ``default_version``). ``versioned``: the
    client has set a version on this server, so a ``"default"`` label means the server
    came back without it (a restart: its model directory's weights): an EngineError, for
    the pool to bring it up to date, never tokens under a version they are not. ``finish_reason``
    "stop" with a ``stop_reason`` in ``stop_token_ids`` is a stop token; "length" and
    "abort" are ours; anything else (vLLM's "error", "repetition") is an EngineError.
    """
    try:
        choice = body["choices"][0]
        ids = [int(t) for t in choice["token_ids"] or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(c["logprob"]) for c in content]
        spans = choice.get("weight_versions") or []
        versions = versions_of(spans, len(ids), default_version)
        unversioned = [s["version"] for s in spans if _as_int(s["version"], None) is None]
        reason = choice.get("finish_reason") or "length"
        stop = choice.get("stop_reason")
        usage = body.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise EngineError(f"malformed /inference/v1/generate response: {exc!r}") from exc
    if versioned and unversioned:
        raise EngineError(
            f"vLLM answered with weights labelled {unversioned[0]!r:.40}, none of the run's "
            "versions: it restarted at its model directory's weights"
        )
    if reason not in ("stop", "length", "abort"):
        raise EngineError(f"vLLM ended the request with finish_reason {reason!r}")
    matched = None
    if reason == "stop":
        if not (isinstance(stop, int) and stop in stop_token_ids and ids and ids[-1] == stop):
            # Only stop_token_ids may end a request of ours (ignore_eos, no stop strings).
            raise BadReply(f"finish_reason 'stop' on {stop!r}, which is no stop token asked for")
        matched = stop
    out = TokenOutput(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=reason,
        matched_stop=matched,
        versions=versions,
        prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
        cached_tokens=int(details.get("cached_tokens", 0) or 0),
    )
    why = check_reply(out, vocab_size=vocab_size, max_version=max_version)
    if why is not None:
        raise BadReply(f"impossible /inference/v1/generate reply: {why}")
    return out


class VLLMEngine(SGLangEngine):
    """An :class:`~tunix_agentic.inference.base.InferenceEngine` over a vLLM server.

    ``model_cfg`` (the run's :class:`~tunix_agentic.models.transformer.ModelConfig`) names
    the tensors of the weights it writes; without it :meth:`update_weights` fails (a
    client that only generates needs none). ``weights_dtype``: the dtype written (default:
    the model's). Everything else (sessions, health, the weights directory, the order of
    updates) is :class:`~tunix_agentic.serving.client.SGLangEngine`'s.
    """

    def __init__(self, base_url: str, **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self.last_reload_s: float | None = None  # the last update's pause-to-resume seconds

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        """POST ``/inference/v1/generate``; cancelling the caller aborts the request on the
        server. ``session_id`` is not used (vLLM's prefix cache finds a shared history by
        itself). With ``on_tokens`` the whole output is handed on once, when it is in."""
        rid = request_id or f"{self._rid_prefix}-{next(self._rid_counter)}"
        payload = {
            "request_id": rid,
            "token_ids": [int(t) for t in prompt_ids],
            "sampling_params": vllm_sampling(sampling),
            "output_mode": "tokens",
        }
        status, data, text = await self._sent(
            rid, self._request("POST", "/inference/v1/generate", payload)
        )
        if status != 200:
            message = _error_message(data, text)
            if status == 400 and _TOO_LONG.search(message):
                raise PromptTooLongError(message)
            if 400 <= status < 500 and status not in (403, 404, 405):
                raise ValueError(message)
            raise EngineError(
                f"{self.name}: /inference/v1/generate answered HTTP {status}: {message}"
                + (" (start vLLM with --enable-scale-out)" if status == 403 else "")
            )
        out = self._received(
            parse_vllm_response,
            data,
            stop_token_ids=sampling.stop_token_ids,
            versioned=self._version is not None,
        )
        if on_tokens is not None and out.token_ids:
            on_tokens(list(out.token_ids))
        return out

    async def abort(self, request_id: str) -> bool:
        """Best effort ``POST /inference/v1/abort_requests`` with vLLM's id for it."""
        try:
            status, _, _ = await self._request(
                "POST",
                "/inference/v1/abort_requests",
                {"request_ids": [REQUEST_PREFIX + request_id]},
                timeout_s=_ABORT_TIMEOUT_S,
            )
        except EngineError:
            return False
        return status == 200

    async def model_info(self) -> dict[str, Any]:
        """``GET /v1/models``'s first model (its ``id`` and ``max_model_len``) and the
        ``weight_version`` it holds (``GET /weight_info``; ``"default"`` until one is set)."""
        status, data, text = await self._request("GET", "/v1/models")
        try:
            info = dict(data["data"][0])
        except (KeyError, TypeError, IndexError) as exc:
            raise EngineError(
                f"{self.name}: /v1/models answered HTTP {status}: {text[:200]}"
            ) from exc
        status, data, text = await self._request("GET", "/weight_info")
        if status == 200 and isinstance(data, dict):
            info["weight_version"] = data.get("weight_version")
        return info

    async def _call(self, path: str, payload: Any = None) -> Any:
        status, data, text = await self._request("POST", path, payload)
        if status != 200:
            hint = " (start vLLM with VLLM_SERVER_DEV_MODE=1)" if status == 404 else ""
            raise EngineError(
                f"{self.name}: {path} answered HTTP {status}: {_error_message(data, text)}{hint}"
            )
        return data

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Load the safetensors under ``path`` as ``version``: pause keeping requests,
        reload in place, drop the prefix cache (its KV is the old weights'), set the
        version, resume. The server resumes whatever happens, on the old weights if the
        reload failed (an EngineError then, the version unchanged)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self._call("/pause?mode=keep")
        try:
            await self._call(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
            )
            await self._call("/reset_prefix_cache")
            await self._call("/update_weight_version", {"new_version": str(int(version))})
        finally:
            await self._call("/resume")
        self.last_reload_s = loop.time() - start
        self._version = int(version)

    def _save_weights(self, path: Path, params: Any) -> None:
        if self.model_cfg is None:  # vLLM reads safetensors only
            raise EngineError(
                f"{self.name}: VLLMEngine(model_cfg=...) is needed to write weights vLLM reads"
            )
        super()._save_weights(path, params)
