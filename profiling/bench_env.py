"""The rollout benchmark's slow arithmetic environment, registered for rollout nodes.

``python -m profiling.bench_rollout --service N`` starts ``serve-rollout`` nodes in the
repository root with ``env.import=profiling.bench_env``, so their episodes wait as the
in-process benchmark's do (sandbox start-up, lognormal tool latency, slow verifier; see
``profiling.common.Waits``). A benchmark device only.
"""

from __future__ import annotations

import numpy as np

from profiling.common import SlowArithmeticEnv, Waits
from tunix_agentic.envs.base import register_env
from tunix_agentic.envs.calculator import ArithmeticTasks

_LATENCY_STREAMS: dict[int, np.random.Generator] = {}


@register_env("bench_slow_arithmetic", tasks=ArithmeticTasks())
def make_slow_arithmetic(
    reset_s: float = 0.3,
    tool_mean_s: float = 0.2,
    tool_sigma: float = 0.5,
    eval_s: float = 0.5,
    seed: int = 0,
) -> SlowArithmeticEnv:
    """A :class:`profiling.common.SlowArithmeticEnv`; all of a process's environments of one
    ``seed`` share one latency stream (as ``profiling.common.slow_env_factory``'s do)."""
    rng = _LATENCY_STREAMS.setdefault(seed, np.random.default_rng(seed))
    return SlowArithmeticEnv(Waits(reset_s, tool_mean_s, tool_sigma, eval_s), rng)
