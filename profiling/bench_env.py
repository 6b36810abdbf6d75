"""The rollout benchmark's slow arithmetic environment, registered for rollout nodes.

``bench_rollout.py --service N`` starts ``serve-rollout`` nodes with
``env.import=profiling/bench_env.py``, so their episodes wait as the in-process
benchmark's do (sandbox start-up, lognormal tool latency, slow verifier; see
``common.Waits``). A benchmark device only.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `common`, as the scripts do

from common import SlowArithmeticEnv, Waits  # noqa: E402

from tunix_agentic.envs.base import register_env  # noqa: E402
from tunix_agentic.envs.calculator import ArithmeticTasks  # noqa: E402

_LATENCY_STREAMS: dict[int, np.random.Generator] = {}


@register_env("bench_slow_arithmetic", tasks=ArithmeticTasks())
def make_slow_arithmetic(
    reset_s: float = 0.3,
    tool_mean_s: float = 0.2,
    tool_sigma: float = 0.5,
    eval_s: float = 0.5,
    seed: int = 0,
) -> SlowArithmeticEnv:
    """A :class:`common.SlowArithmeticEnv`; all of a process's environments of one
    ``seed`` share one latency stream (as ``common.slow_env_factory``'s do)."""
    rng = _LATENCY_STREAMS.setdefault(seed, np.random.default_rng(seed))
    return SlowArithmeticEnv(Waits(reset_s, tool_mean_s, tool_sigma, eval_s), rng)
