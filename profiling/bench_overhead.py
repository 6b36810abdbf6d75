"""The orchestrator's own overhead at scale, printed, never asserted.

10,000 concurrent episodes through ``RolloutOrchestrator.run_tasks`` with the
real :class:`ArithmeticEnv` (no waits) and an :class:`InstantEngine` (a
benchmark device that answers at once: a calculator call, then an answer), so
all the time and memory measured is the orchestrator's: tasks, semaphores,
the agent loop, parsing, the environment, trajectories. Pools are as large as
the episode count, so every episode is in flight at once.

Three runs of the same work: one timed; one timed with Python's cyclic garbage
collector off (its full collections grow with the number of live objects,
so their share grows with concurrency); one under ``tracemalloc`` (which slows
Python down several times) for the memory figures.

    python -m profiling.bench_overhead
    BENCH_EPISODES=50000 python -m profiling.bench_overhead

Environment: BENCH_EPISODES (10000), BENCH_GROUP_SIZE (8), BENCH_POOL (episodes), BENCH_SEED (0).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import time
import tracemalloc
from typing import Any

from profiling.common import InstantEngine, env_int, max_rss_mb
from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import Group, RolloutConfig, RolloutOrchestrator

AGENT = AgentConfig(max_turns=3, max_new_tokens=48, temperature=1.0)


@dataclasses.dataclass(frozen=True)
class OverheadParams:
    episodes: int = 10_000
    group_size: int = 8
    pool: int | None = None  # None: as many as episodes
    seed: int = 0


@dataclasses.dataclass
class OverheadResult:
    episodes: int
    steps: int  # agent turns, each one engine call and one env step
    wall_s: float
    episodes_per_s: float
    per_episode_us: float
    per_step_us: float
    gc_off_per_episode_us: float  # the same run with Python's cyclic GC switched off
    tracemalloc_peak_mb: float
    retained_bytes_per_trajectory: float  # still held by the returned groups
    peak_bytes_per_episode: float  # tracemalloc peak over the run / episodes
    rss_peak_mb: float  # ru_maxrss of the whole process (JAX included)
    rss_growth_mb: float  # ru_maxrss after the runs minus before
    statuses: dict[str, int]

    def lines(self) -> list[str]:
        return [
            f"RESULT overhead: {self.episodes:,} concurrent episodes, {self.steps:,} steps in "
            f"{self.wall_s:.2f}s = {self.episodes_per_s:,.0f} episodes/s; "
            f"{self.per_episode_us:,.0f} us/episode, {self.per_step_us:,.0f} us/step; "
            f"with the cyclic GC off {self.gc_off_per_episode_us:,.0f} us/episode "
            f"(GC {100 * (1 - self.gc_off_per_episode_us / self.per_episode_us):.0f}% of the time)",
            f"RESULT memory: tracemalloc peak {self.tracemalloc_peak_mb:.1f} MB "
            f"({self.peak_bytes_per_episode:,.0f} B/episode at peak), "
            f"{self.retained_bytes_per_trajectory:,.0f} B/trajectory retained; "
            f"RSS peak {self.rss_peak_mb:.0f} MB (+{self.rss_growth_mb:.0f} MB over the runs)",
        ]


def make_orchestrator(p: OverheadParams, template: ChatTemplate) -> RolloutOrchestrator:
    pool = p.pool or p.episodes
    config = RolloutConfig(
        group_size=p.group_size,
        init_workers=pool,
        run_workers=pool,
        eval_workers=pool,
        episode_timeout_s=3600.0,
        filter_uniform_groups=False,
        seed=p.seed,
    )
    return RolloutOrchestrator.in_process(
        InstantEngine(template.tokenizer), ArithmeticEnv, template, AGENT, config
    )


async def run_once(p: OverheadParams, template: ChatTemplate) -> tuple[list[Group], float]:
    orch = make_orchestrator(p, template)
    n_tasks = -(-p.episodes // p.group_size)
    tasks = [make_arithmetic_task(i, seed=p.seed, split="train") for i in range(n_tasks)]
    t = time.perf_counter()
    groups = await orch.run_tasks(tasks, group_size=p.group_size)
    return groups, time.perf_counter() - t


def run(p: OverheadParams) -> OverheadResult:
    template = ChatTemplate(CharTokenizer(128))
    small = dataclasses.replace(p, episodes=min(p.episodes, 256))
    asyncio.run(run_once(small, template))  # first-call costs (imports, regex compiles)
    rss0 = max_rss_mb()

    gc.collect()
    groups, wall = asyncio.run(run_once(p, template))
    trajs = [t for g in groups for t in g.trajectories + g.dropped]
    steps = sum(len(t.steps) for t in trajs)
    statuses: dict[str, int] = {}
    for t in trajs:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    del groups, trajs

    gc.collect()
    gc.disable()
    try:
        groups, gc_off_wall = asyncio.run(run_once(p, template))
    finally:
        gc.enable()
    del groups

    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    traced_groups, _ = asyncio.run(run_once(p, template))
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = sum(len(g.trajectories) + len(g.dropped) for g in traced_groups)
    del traced_groups

    return OverheadResult(
        episodes=n,
        steps=steps,
        wall_s=wall,
        episodes_per_s=n / wall,
        per_episode_us=1e6 * wall / n,
        per_step_us=1e6 * wall / max(steps, 1),
        gc_off_per_episode_us=1e6 * gc_off_wall / n,
        tracemalloc_peak_mb=(peak - base) / 2**20,
        retained_bytes_per_trajectory=(held - base) / n,
        peak_bytes_per_episode=(peak - base) / n,
        rss_peak_mb=max_rss_mb(),
        rss_growth_mb=max_rss_mb() - rss0,
        statuses=statuses,
    )


def parse_args(argv: list[str] | None) -> OverheadParams:
    d = OverheadParams()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=env_int("BENCH_EPISODES", d.episodes))
    ap.add_argument("--group-size", type=int, default=env_int("BENCH_GROUP_SIZE", d.group_size))
    ap.add_argument("--pool", type=int, default=env_int("BENCH_POOL", 0) or None)
    ap.add_argument("--seed", type=int, default=env_int("BENCH_SEED", d.seed))
    a = ap.parse_args(argv)
    return OverheadParams(episodes=a.episodes, group_size=a.group_size, pool=a.pool, seed=a.seed)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the overhead benchmark; returns the figures it printed."""
    result = run(parse_args(argv))
    for line in result.lines():
        print(line)
    print(f"       episode statuses: {result.statuses}")
    return dataclasses.asdict(result)


if __name__ == "__main__":
    main()
