"""Shared pieces of the benchmarks: the peers' model and workload sizes, a slow
arithmetic environment, an instant engine, engine warm-up and percentile helpers.

Benchmark devices only: nothing here is used by the library or the tests of
the library. (The pair machinery of the peer benchmarks is :mod:`profiling.pairs`.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import resource
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTask, CalculatorTool
from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.transformer import ModelConfig


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# ---------------------------------------------------------- the peers' model
# The peers' toy decoder (profiling/peers/toy_common.py) as our ModelConfig: 4.46M
# parameters, Qwen3-style. bench_engine, bench_learner and bench_prefix_cache run it.
PEER_DIMS = ModelConfig(
    vocab_size=2048,
    d_model=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    ffn_dim=1024,
    rope_theta=1_000_000.0,
    qk_norm=True,
    tie_embeddings=True,
)
PEER_PROMPT, PEER_NEW = 32, 64  # the peers' decode workload: prompt and new tokens
DECODE_STEPS = env_int("ENGINE_DECODE_STEPS", 16)  # engine.decode_steps on our side


def matmul_peak_gflops(n: int = 1024, reps: int = 10) -> float:
    """This machine's f32 ``n x n`` matmul rate under XLA, in GFLOP/s: ``reps`` calls
    timed together after one that compiles."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        f(a).block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


# ------------------------------------------------------------------ waits
@dataclasses.dataclass(frozen=True)
class Waits:
    """Wall-clock costs of a realistic environment, in seconds.

    ``reset_s``: sandbox start-up; ``tool_mean_s``/``tool_sigma``: each tool
    call sleeps a lognormal latency with this mean and log-space sigma;
    ``eval_s``: the slow verifier.
    """

    reset_s: float = 0.3
    tool_mean_s: float = 0.2
    tool_sigma: float = 0.5
    eval_s: float = 0.5

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"waits.{f.name} must be >= 0, got {getattr(self, f.name)}")

    @classmethod
    def from_env(cls) -> Waits:
        """BENCH_RESET_S, BENCH_TOOL_MEAN_S, BENCH_TOOL_SIGMA, BENCH_EVAL_S override the defaults."""
        d = cls()
        return cls(
            reset_s=env_float("BENCH_RESET_S", d.reset_s),
            tool_mean_s=env_float("BENCH_TOOL_MEAN_S", d.tool_mean_s),
            tool_sigma=env_float("BENCH_TOOL_SIGMA", d.tool_sigma),
            eval_s=env_float("BENCH_EVAL_S", d.eval_s),
        )

    @property
    def tool_mu(self) -> float:
        """Log-space mean so that E[exp(N(mu, sigma^2))] = tool_mean_s."""
        return math.log(self.tool_mean_s) - self.tool_sigma**2 / 2

    def describe(self) -> str:
        return (
            f"reset {self.reset_s:g}s, tool lognormal mean {self.tool_mean_s:g}s "
            f"(sigma {self.tool_sigma:g}), verifier {self.eval_s:g}s"
        )


class SlowCalculatorTool(CalculatorTool):
    """The calculator behind a remote call: sleeps ``latency()`` seconds, then computes."""

    def __init__(self, latency: Callable[[], float]):
        super().__init__()
        self._latency = latency

    async def run(self, expression: str) -> str:  # type: ignore[override]
        delay = self._latency()
        if delay > 0:
            await asyncio.sleep(delay)
        return await super().run(expression)


class SlowArithmeticEnv(ArithmeticEnv):
    """:class:`ArithmeticEnv` with a sandbox start-up, slow tool calls and a slow verifier.

    Waits are ``asyncio.sleep``s, as a remote sandbox or verifier would be:
    they block the episode, never the event loop.
    """

    def __init__(self, waits: Waits, rng: np.random.Generator, *, tool_timeout: float = 5.0):
        super().__init__(tool_timeout=tool_timeout)
        self.waits = waits
        self._rng = rng
        self.tools = {"calculator": SlowCalculatorTool(self._tool_latency)}

    def _tool_latency(self) -> float:
        w = self.waits
        if w.tool_mean_s <= 0:
            return 0.0
        return float(self._rng.lognormal(w.tool_mu, w.tool_sigma))

    async def reset(self, task: ArithmeticTask) -> str:
        if self.waits.reset_s > 0:
            await asyncio.sleep(self.waits.reset_s)
        return await super().reset(task)

    async def evaluate(self) -> float:
        if self.waits.eval_s > 0:
            await asyncio.sleep(self.waits.eval_s)
        return await super().evaluate()


def slow_env_factory(waits: Waits, seed: int = 0) -> Callable[[], SlowArithmeticEnv]:
    """A zero-argument factory; all its environments share one seeded latency stream."""
    rng = np.random.default_rng(seed)
    return lambda: SlowArithmeticEnv(waits, rng)


# ---------------------------------------------------------- instant engine
class InstantEngine:
    """A benchmark device, not a model: answers every ``generate`` at once.

    It isolates the orchestrator's own overhead (tasks, semaphores, parsing,
    environment calls, trajectory bookkeeping) from any model cost. The first
    turn of an episode gets a canned calculator call; a turn whose prompt
    already holds a tool response gets a canned, well-formed answer. Ids come
    from the real :class:`CharTokenizer`, so the agent loop parses them as it
    would a model's.
    """

    def __init__(self, tokenizer: CharTokenizer, *, expression: str = "6*7", answer: str = "42"):
        end = "<|im_end|>"
        call = (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "'
            + expression
            + '"}}</tool_call>'
        )
        self._call = tokenizer.encode(call + end)
        self._answer = tokenizer.encode(f"<answer>{answer}</answer>{end}")
        self._response_id = tokenizer.encode("<tool_response>")[0]
        self.version = 0
        self.calls = 0

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> TokenOutput:
        self.calls += 1
        ids = self._answer if self._response_id in prompt_ids else self._call
        n = len(ids)
        return TokenOutput(
            token_ids=list(ids),
            logprobs=[-0.1] * n,
            finish_reason="stop",
            matched_stop=ids[-1],
            versions=[self.version] * n,
            prompt_tokens=len(prompt_ids),
        )

    def update_weights(self, params: Any, version: int) -> None:
        self.version = int(version)

    def health(self) -> dict[str, Any]:
        return {"ok": True, "version": self.version, "calls": self.calls}

    @property
    def in_flight(self) -> int:
        return 0


# ---------------------------------------------------------------- helpers
async def warm_engine(engine: JaxEngine) -> float:
    """Compile every prefill shape (row bucket x length bucket) and the decode chunk.

    Goes through the public API: ``r`` concurrent one-token requests of a
    length in bucket ``L`` are admitted together and prefilled as one
    ``[r, L]`` call. Returns the seconds it took.
    """
    t = time.perf_counter()
    cfg = engine.config
    vocab = engine.model_config.vocab_size
    one = SamplingParams(temperature=0.0, max_new_tokens=1)
    for length in cfg.length_buckets():
        n = min(length, cfg.max_seq_len - 1)
        prompt = [int(i) for i in np.arange(n) % (vocab - 1) + 1]
        for rows in cfg.row_buckets():
            await asyncio.gather(*(engine.generate(prompt, one) for _ in range(rows)))
    two = SamplingParams(temperature=0.0, max_new_tokens=2)
    await engine.generate([1, 2, 3], two)  # one decode chunk
    return time.perf_counter() - t


async def clean_call_times(
    engine: JaxEngine, call: Callable[[int], Awaitable[Any]], repeats: int, label: str
) -> tuple[list[float], float]:
    """``call(0)`` untimed, then ``call(1)`` .. ``call(repeats)`` timed, each call's compiles
    counted (``engine.compiles``): a timed call that compiled is printed and left out.
    Returns the clean calls' seconds and the first call's. ``call(i)`` should send fresh
    prompts (seeded by ``i``), so no call reuses a prefix an earlier one cached."""

    async def once(i: int) -> tuple[float, int]:
        before = sum(engine.compiles.values())
        t = time.perf_counter()
        await call(i)
        return time.perf_counter() - t, sum(engine.compiles.values()) - before

    first, _ = await once(0)  # the first dispatch of each program
    times = []
    for i in range(1, repeats + 1):
        seconds, compiled = await once(i)
        if compiled:
            print(f"  {label} call {i}: {compiled} compile(s), left out of the figure")
        else:
            times.append(seconds)
    if not times:
        raise RuntimeError(f"{label}: every timed call compiled; nothing to report")
    return times, first


def percentiles(values: Iterable[float], qs: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    arr = np.asarray(list(values), np.float64)
    if arr.size == 0:
        return {f"p{q}": float("nan") for q in qs}
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs}


def max_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class HandoffProbe:
    """How late a thread waking from a blocking call gets to run Python again.

    A background thread sleeps ``period_s`` over and over and records by how much
    each sleep overran. That is the delay the engine's waiter thread suffers
    between a device call completing and its timestamp (it must take the GIL
    back from the agents' Python first): the error bar on the engine's busy /
    host-gap split. Waking 1/period_s times a second, it perturbs little.
    """

    def __init__(self, period_s: float = 0.005):
        self.period_s = period_s
        self.late_s: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(self.period_s)
            self.late_s.append(time.perf_counter() - t - self.period_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="handoff-probe", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        """p50 / p95 / mean lateness in milliseconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        late = np.asarray(self.late_s or [0.0]) * 1e3
        return {
            "handoff_p50_ms": float(np.percentile(late, 50)),
            "handoff_p95_ms": float(np.percentile(late, 95)),
            "handoff_mean_ms": float(late.mean()),
        }


class InFlightSampler:
    """Samples ``engine.in_flight`` every ``period_s`` on the event loop; ``mean`` afterwards."""

    def __init__(self, engine: Any, period_s: float = 0.01):
        self.engine = engine
        self.period_s = period_s
        self.samples: list[int] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.samples.append(int(self.engine.in_flight))
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return float(np.mean(self.samples)) if self.samples else 0.0
