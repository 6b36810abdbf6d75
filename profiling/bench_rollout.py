"""Synchronous batch rollout vs the asynchronous staged pipeline, printed, never asserted.

One process, one real :class:`JaxEngine` over the tiny calculator model
(configs/calculator_tiny.yaml dims), warm-started by SFT on tool-using
demonstrations so episodes really call the calculator. The environment waits
as a remote one would (profiling.common: sandbox start-up, lognormal tool
latency, slow verifier).

* sync: a batch of episodes is reset together, then turn by turn every active
  episode generates (one engine batch) and steps; then all are verified; then
  the learner trains (``train_s``) and only then the next batch starts.
* async: the trainer's RL loop (:func:`tunix_agentic.rl_loop.run_rl_steps`):
  :class:`RolloutOrchestrator` produces continuously (INIT/RUN/EVAL pools); a
  simulated learner takes each batch, trains ``train_s`` on its thread, and
  its weights go to the engine (no drain) before the version is bumped (no
  DAPO filter). ``--max-staleness 1,2,4`` runs the
  async mode once per bound, so the throughput each policy lag buys is seen
  in one run.

Both modes hand the learner the same number of trajectories from the same
task stream; both walls include the learner's train steps.

* service (``--service N``): the async workload again, but the groups run on
  ``tunix-agentic serve-rollout`` nodes (real processes on loopback, the same slow
  environment through ``profiling.bench_env``) generating with this process's
  engine served over HTTP, as ``tunix-agentic train rollout.service.urls=...``
  runs: once through one node, and through N nodes when N >= 2. Printed as ratios
  to the in-process async run (goal: one node >= 90 %). Nodes cannot INIT ahead
  of admission, so compare with ``--prefetch-groups 0`` for the same pipeline. The
  in-process run is repeated after the service runs and each service run is also printed
  as a ratio to the faster of the two (the load of a shared machine drifts between runs,
  and each mode prints how many engine compiles fell inside it).

    python -m profiling.bench_rollout
    BENCH_TRAJECTORIES=512 BENCH_TRAIN_S=1.0 python -m profiling.bench_rollout
    python -m profiling.bench_rollout --set engine.max_slots=32   # any config override
    python -m profiling.bench_rollout --service 2 --prefetch-groups 0   # + 1 and 2 nodes
    python -m profiling.bench_rollout --service 1 --prefetch-groups 0 --node-max-groups 8

Environment: BENCH_TRAJECTORIES (256), BENCH_GROUP_SIZE (8), BENCH_GROUPS_PER_BATCH (8),
BENCH_SFT_STEPS (250), BENCH_SFT_BATCH (16), BENCH_TRAIN_S (0.5), BENCH_POOL (64),
BENCH_MAX_STALENESS (1), BENCH_PREFETCH_GROUPS (8), BENCH_RESET_S (0.3), BENCH_TOOL_MEAN_S (0.2),
BENCH_TOOL_SIGMA (0.5), BENCH_EVAL_S (0.5), BENCH_SEED (0), BENCH_SERVICE (0).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from profiling.common import (
    HandoffProbe,
    InFlightSampler,
    Waits,
    env_float,
    env_int,
    percentiles,
    slow_env_factory,
    warm_engine,
)
from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.context import get_context_rule
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.config import RunConfig, load_config
from tunix_agentic.data.demos import DemoSource, demonstration_batches
from tunix_agentic.data.tasks import heldout_tasks, task_iterator
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.inference import JaxEngine, PromptTooLongError
from tunix_agentic.learners.batching import sft_batch
from tunix_agentic.learners.sft import SFTTrainer
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.transformer import Transformer, count_params
from tunix_agentic.rl_loop import StepReport, run_rl_steps
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator, Step, Trajectory
from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner
from tunix_agentic.serving.engine_server import start_server

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "calculator_tiny.yaml"
AGENT = AgentConfig(max_turns=3, max_new_tokens=48, temperature=1.0)
ARITHMETIC = ArithmeticTasks()


@dataclasses.dataclass(frozen=True)
class BenchParams:
    trajectories: int = 256
    group_size: int = 8
    groups_per_batch: int = 8
    sft_steps: int = 250
    sft_batch: int = 16
    min_tool_use: float = 0.8  # below this after SFT: train sft_steps more, up to 3 times
    train_s: float = 0.5
    pool: int = 64
    max_staleness: tuple[int, ...] = (1,)
    prefetch_groups: int = 8  # async: groups INIT'ed ahead of admission (rollout.prefetch_groups)
    overrides: tuple[str, ...] = ()  # dotted config overrides, e.g. "engine.max_slots=32"
    warmup: bool = True
    seed: int = 0
    waits: Waits = Waits()
    service: int = 0  # rollout nodes of the service mode (0: off; 1: one node; N: 1 and N)
    node_max_groups: int | None = None  # serve-rollout --max-groups (None: the node's default)

    @property
    def batch_size(self) -> int:
        return self.group_size * self.groups_per_batch


@dataclasses.dataclass
class ModeResult:
    """What one mode achieved; every time in seconds."""

    mode: str
    trajectories: int
    wall_s: float
    traj_per_s: float
    engine_busy: float  # engine busy_s delta / wall
    trainer_wait_s: float
    latency_p50_s: float
    latency_p95_s: float
    latency_p99_s: float
    tool_use: float
    success: float
    gen_tokens_per_s: float
    mean_in_flight: float  # engine requests queued or decoding, sampled every 10 ms
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def line(self) -> str:
        return (
            f"RESULT {self.mode:5s}: {self.trajectories} traj in {self.wall_s:.1f}s = "
            f"{self.traj_per_s:.2f} traj/s; engine busy {100 * self.engine_busy:.1f}%; "
            f"trainer wait {self.trainer_wait_s:.1f}s ({100 * self.trainer_wait_s / self.wall_s:.0f}% of wall); "
            f"episode latency p50/p95/p99 {self.latency_p50_s:.2f}/{self.latency_p95_s:.2f}/"
            f"{self.latency_p99_s:.2f}s; tool use {self.tool_use:.2f}, success {self.success:.2f}; "
            f"engine busy on void chunks {100 * self.extra.get('engine_void', 0):.1f}%, "
            f"host gaps {100 * self.extra.get('engine_sched_gap', 0):.1f}%, idle "
            f"{100 * self.extra.get('engine_idle', 0):.1f}%; "
            f"{self.gen_tokens_per_s:,.0f} gen tok/s; mean engine in-flight {self.mean_in_flight:.1f}; "
            f"{self.extra.get('compiles', 0)} engine compiles during it"
            f"\n       thread hand-off p50/p95 {self.extra.get('handoff_p50_ms', 0):.2f}/"
            f"{self.extra.get('handoff_p95_ms', 0):.2f} ms (how late a completion time may be "
            f"taken: the error bar on busy vs host gaps)"
        )


def _summarise(
    mode: str,
    trajs: list[Trajectory],
    latencies: list[float],
    wall: float,
    busy: float,
    wait: float,
    in_flight: float,
    **extra: Any,
) -> ModeResult:
    q = percentiles(latencies)
    n = len(trajs)
    return ModeResult(
        mode=mode,
        trajectories=n,
        wall_s=wall,
        traj_per_s=n / wall,
        engine_busy=busy / wall,
        trainer_wait_s=wait,
        latency_p50_s=q["p50"],
        latency_p95_s=q["p95"],
        latency_p99_s=q["p99"],
        tool_use=float(np.mean([any(s.tool_calls for s in t.steps) for t in trajs])),
        success=float(np.mean([t.reward > 0 for t in trajs])),
        gen_tokens_per_s=sum(t.num_generated for t in trajs) / wall,
        mean_in_flight=in_flight,
        extra=extra,
    )


# ------------------------------------------------------------------ policy
async def prepare_policy(
    p: BenchParams, cfg: RunConfig, template: ChatTemplate
) -> tuple[JaxEngine, SFTTrainer, Iterator[dict], float]:
    """An engine serving the config's model, SFT-trained on demonstrations that all use the
    calculator; returns (engine, trainer, demo batches, warm-up seconds).

    Compiling every engine shape does not depend on the weights, so it runs on the
    event loop while SFT runs on a worker thread; the trained weights are then swapped in.
    """
    trainer = SFTTrainer(Transformer(cfg.model, rngs=nnx.Rngs(p.seed)), cfg.sft.optimizer)
    engine = JaxEngine(trainer.state.model(), cfg.engine)
    demos = {"arithmetic": DemoSource(ARITHMETIC, ArithmeticEnv().tool_schemas())}
    batches = demonstration_batches(
        demos, template, seed=p.seed, batch_size=p.sft_batch, tool_fraction=1.0
    )
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sft") as pool:
        trained = asyncio.get_running_loop().run_in_executor(
            pool, sft, trainer, batches, p.sft_steps
        )
        warm_s = 0.0
        if p.warmup:
            t = time.perf_counter()
            # Ahead of time from shapes alone (every row x length bucket), then through the
            # API: a shape first met inside a timed run would stall it for seconds here.
            await asyncio.to_thread(engine.warmup)
            await warm_engine(engine)
            warm_s = time.perf_counter() - t
        await trained
    engine.update_weights(trainer.state.params_for_model(), engine.version)
    return engine, trainer, batches, warm_s


def sft(trainer: SFTTrainer, batches, steps: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for _ in range(steps):
        out = trainer.train_step(sft_batch(next(batches), pad_id=0))
    return out


async def tool_use_rate(engine: JaxEngine, template: ChatTemplate, p: BenchParams) -> float:
    """Tool-use rate on held-out tasks (no waits), sampled as in the benchmark."""
    orch = RolloutOrchestrator.in_process(
        engine,
        ArithmeticEnv,
        template,
        AGENT,
        RolloutConfig(filter_uniform_groups=False, run_workers=p.pool, seed=p.seed + 1),
    )
    groups = await orch.run_tasks(
        heldout_tasks(ARITHMETIC, p.groups_per_batch, seed=p.seed), group_size=p.group_size
    )
    trajs = [t for g in groups for t in g.trajectories]
    return float(np.mean([any(s.tool_calls for s in t.steps) for t in trajs])) if trajs else 0.0


# -------------------------------------------------------------------- sync
async def sync_batch(
    engine: JaxEngine,
    env_factory,
    template: ChatTemplate,
    tasks: list[Any],
    group_size: int,
    batch_index: int,
    seed: int,
) -> tuple[list[Trajectory], list[float]]:
    """One lockstep batch: reset all, then per turn generate all / step all, then verify all.

    Same agent pieces as the async loop (template, parser, context rule,
    Trajectory), so the two produce equivalent token histories.
    """
    parse = get_parser(AGENT.parser)
    context_of = get_context_rule(AGENT.context_rule)
    episodes = [(t, m) for t in tasks for m in range(group_size)]
    envs = [env_factory() for _ in episodes]
    trajs = [
        Trajectory(
            task_id=str(task.task_id),
            episode_id=f"sync-b{batch_index}-{task.task_id}-{member}",
            task_name=task.task_name,
            group_id=f"sync-b{batch_index}-{task.task_id}",
        )
        for task, member in episodes
    ]
    seeds = [
        (seed * 1_000_003 + batch_index * len(tasks) + i // group_size) * 64 + i % group_size
        for i in range(len(episodes))
    ]
    t0 = time.perf_counter()
    prompts = await asyncio.gather(
        *(env.reset(task) for env, (task, _) in zip(envs, episodes, strict=True))
    )
    for traj, prompt in zip(trajs, prompts, strict=True):
        traj.append_prompt(template.prompt_ids(prompt))

    async def generate(i: int, turn: int):
        sampling = AGENT.sampling(template.stop_ids, seed=seeds[i], turn=turn)
        try:
            return await engine.generate(
                context_of(trajs[i]), sampling, session_id=trajs[i].episode_id
            )
        except PromptTooLongError:
            return None

    active = list(range(len(episodes)))
    for turn in range(AGENT.max_turns):
        outs = await asyncio.gather(*(generate(i, turn) for i in active))
        stepping = []
        for i, out in zip(active, outs, strict=True):
            if out is None:
                trajs[i].status = "max_tokens"
                continue
            text = template.tokenizer.decode(out.token_ids)
            step = Step(
                context_len=len(trajs[i].token_ids),
                action_ids=list(out.token_ids),
                logprobs=list(out.logprobs),
                versions=list(out.versions),
                finish_reason=out.finish_reason,
                action_text=text,
            )
            trajs[i].append_action(step)
            if out.finish_reason == "length":
                trajs[i].status = "max_tokens"
            else:
                stepping.append((i, step, parse(text)))
        results = await asyncio.gather(*(envs[i].step(action) for i, _, action in stepping))
        active = []
        for (i, step, _), result in zip(stepping, results, strict=True):
            step.reward, step.done = float(result.reward), bool(result.done)
            step.tool_calls = list(result.info.get("tool_calls", []))
            if result.done:
                trajs[i].status = "ok"
            else:
                trajs[i].append_observation(template.observation_ids(result.observation))
                active.append(i)
        if not active:
            break
    for i in active:
        trajs[i].status = "max_turns"

    ends = [0.0] * len(episodes)

    async def verify(i: int) -> None:
        trajs[i].reward = float(await envs[i].evaluate())
        ends[i] = time.perf_counter()

    await asyncio.gather(*(verify(i) for i in range(len(episodes))))
    await asyncio.gather(*(env.close() for env in envs))
    return trajs, [end - t0 for end in ends]


async def run_sync(
    engine: JaxEngine, template: ChatTemplate, p: BenchParams, params: Any, version: int
) -> ModeResult:
    env_factory = slow_env_factory(p.waits, p.seed)
    tasks = task_iterator(ARITHMETIC, seed=p.seed, split="train")
    trajs: list[Trajectory] = []
    latencies: list[float] = []
    wait = 0.0
    sampler, probe = InFlightSampler(engine), HandoffProbe()
    busy0 = engine.stats["busy_s"]
    other0 = _engine_other(engine)
    compiled0 = sum(engine.compiles.values())
    sampler.start()
    probe.start()
    t0 = time.perf_counter()
    batch_index = 0
    while len(trajs) < p.trajectories:
        batch_tasks = [next(tasks) for _ in range(p.groups_per_batch)]
        t = time.perf_counter()
        got, lat = await sync_batch(
            engine, env_factory, template, batch_tasks, p.group_size, batch_index, p.seed
        )
        wait += time.perf_counter() - t  # the learner idles through the whole rollout
        trajs += got
        latencies += lat
        await asyncio.sleep(p.train_s)  # the train step; rollout stops meanwhile
        version += 1
        engine.update_weights(params, version)
        batch_index += 1
    wall = time.perf_counter() - t0
    busy = engine.stats["busy_s"] - busy0
    in_flight = await sampler.stop()
    handoff = probe.stop()
    return _summarise(
        "sync",
        trajs,
        latencies,
        wall,
        busy,
        wait,
        in_flight,
        rollout_only_traj_per_s=len(trajs) / wait,
        batches=batch_index,
        **_engine_other(engine, other0, wall),
        **handoff,
        compiles=sum(engine.compiles.values()) - compiled0,
    )


# ------------------------------------------------------------------- async
class SimulatedLearner:
    """A learner for the RL loop whose step takes ``train_s`` (on the learner's thread, as
    a jitted step would) and publishes the same parameters each time (the no-drain swap)."""

    def __init__(self, params: Any, train_s: float):
        self.params, self.train_s = params, train_s

    def train_on(self, groups: list) -> dict[str, float]:
        time.sleep(self.train_s)
        return {}

    def params_for_engine(self) -> Any:
        return self.params


async def run_async(
    engine: JaxEngine,
    template: ChatTemplate,
    p: BenchParams,
    params: Any,
    version: int,
    max_staleness: int,
    *,
    nodes: list[str] | None = None,
    engine_url: str | None = None,
) -> ModeResult:
    """The async mode in process, or with ``nodes`` (rollout node URLs) running the groups
    against ``engine`` served at ``engine_url``."""
    config = RolloutConfig(
        group_size=p.group_size,
        groups_per_batch=p.groups_per_batch,
        init_workers=p.pool,
        run_workers=p.pool,
        eval_workers=p.pool,
        max_staleness=max_staleness,
        prefetch_groups=0 if nodes else p.prefetch_groups,
        filter_uniform_groups=False,
        seed=p.seed,
    )
    runner = None
    if nodes:
        runner = ServiceEpisodeRunner(
            nodes,
            agent_config=AGENT,
            config=config,
            version=version,
            engine_urls=[engine_url],
            own_engines=True,
        )
        await runner.connect()
    tasks = task_iterator(ARITHMETIC, seed=p.seed, split="train")
    if runner is None:
        orch = RolloutOrchestrator.in_process(
            engine, slow_env_factory(p.waits, p.seed), template, AGENT, config, tasks=tasks
        )
    else:
        orch = RolloutOrchestrator(runner, config, tasks=tasks)
    orch.set_version(version)
    trajs: list[Trajectory] = []
    lags: list[int] = []
    waits: list[float] = []
    sampler, probe = InFlightSampler(engine), HandoffProbe()
    busy0 = engine.stats["busy_s"]
    other0 = _engine_other(engine)
    compiled0 = sum(engine.compiles.values())
    steady_clock0: dict[str, float] = {}
    ends: list[float] = []
    last: dict[str, Any] = {}

    def on_step(report: StepReport) -> None:
        # Read at each step, so what is kept is the last step's (closing production is not timed).
        ends.append(time.perf_counter())
        last.update(clock=engine.clock(), busy=engine.stats["busy_s"])
        waits.append(report.wait_s)
        if len(waits) == 1:  # the pipeline is full from here on
            steady_clock0.update(engine.clock())
        for g in report.groups:
            trajs.extend(g.trajectories)
            lags.extend(
                report.step - 1 - t.min_version for t in g.trajectories if t.min_version is not None
            )

    batch = p.groups_per_batch * p.group_size
    sampler.start()
    probe.start()
    t0 = time.perf_counter()
    try:
        # The trainer's own loop; the learner's step is simulated (train_s on its thread).
        await run_rl_steps(
            orch,
            engine,
            SimulatedLearner(params, p.train_s),
            start_step=version,
            steps=version + -(-p.trajectories // batch),
            on_step=on_step,
        )
        wall = ends[-1] - t0
        busy = last["busy"] - busy0
        # Busy share of the engine time accounted since then (busy accrues when an op is
        # collected, so a plain busy/wall ratio may count an op begun before the window).
        steady = {k: v - steady_clock0[k] for k, v in last["clock"].items()}
        steady_busy = steady["busy_s"] / max(sum(steady.values()), 1e-9)
    finally:
        handoff = probe.stop()
        if runner is not None:
            await runner.close()
    in_flight = await sampler.stop()
    first = p.groups_per_batch * p.group_size
    return _summarise(
        f"async s={max_staleness}" if not nodes else f"svc n={len(nodes)}",
        trajs,
        [t.timings["episode_s"] for t in trajs],
        wall,
        busy,
        sum(waits),
        in_flight,
        first_batch_wait_s=waits[0],
        # Past the pipeline's fill-up: trajectories after the first batch / time after it came.
        steady_traj_per_s=(len(trajs) - first) / max(wall - waits[0], 1e-9),
        steady_engine_busy=steady_busy,
        **_engine_other(engine, other0, wall),
        **handoff,
        compiles=sum(engine.compiles.values()) - compiled0,
        max_staleness=max_staleness,
        later_batch_wait_mean_s=float(np.mean(waits[1:])) if len(waits) > 1 else 0.0,
        staleness_max=max(lags, default=0),
        orchestrator=dict(orch.stats),
    )


# -------------------------------------------------------------------- main
async def run(p: BenchParams) -> dict[str, Any]:
    cfg = load_config(CONFIG, p.overrides)
    template = ChatTemplate(CharTokenizer(cfg.model.vocab_size))
    engine_cfg = cfg.engine
    t = time.perf_counter()
    engine, trainer, batches, warm_s = await prepare_policy(p, cfg, template)
    prep_s = time.perf_counter() - t
    print(
        f"model: {count_params(trainer.state.model()):,} parameters ({CONFIG.name} dims); "
        f"engine {engine_cfg.max_slots} slots, max_seq_len {engine_cfg.max_seq_len}, "
        f"decode_steps {engine_cfg.decode_steps}"
    )
    steps = p.sft_steps
    tool_use = await tool_use_rate(engine, template, p)
    for _ in range(3):
        if tool_use >= p.min_tool_use:
            break
        sft(trainer, batches, p.sft_steps)
        steps += p.sft_steps
        engine.update_weights(trainer.state.params_for_model(), engine.version)
        tool_use = await tool_use_rate(engine, template, p)
    print(
        f"warm start: {steps} SFT steps (batch {p.sft_batch}, tool_fraction 1.0) beside the "
        f"engine warm-up ({warm_s:.0f}s, compiles {engine.compiles}): {prep_s:.0f}s; "
        f"held-out tool-use rate {tool_use:.2f}"
    )
    print(
        f"waits: {p.waits.describe()}; train step {p.train_s:g}s; {p.trajectories} trajectories "
        f"per mode, batches of {p.groups_per_batch} tasks x G={p.group_size}; async pools {p.pool}, "
        f"max_staleness {p.max_staleness}, prefetch_groups {p.prefetch_groups}"
    )
    params = trainer.state.params_for_model()
    compiles0 = dict(engine.compiles)
    sync = await run_sync(engine, template, p, params, engine.version)
    print(sync.line())
    print(
        f"       sync rollout alone (train steps excluded): "
        f"{sync.extra['rollout_only_traj_per_s']:.2f} traj/s"
    )
    runs = []
    for bound in p.max_staleness:
        asyn = await run_async(engine, template, p, params, engine.version, bound)
        runs.append(asyn)
        print(asyn.line())
        o = asyn.extra["orchestrator"]
        print(
            f"       first batch waited {asyn.extra['first_batch_wait_s']:.2f}s, later batches "
            f"{asyn.extra['later_batch_wait_mean_s']:.2f}s on average; steady state (after the "
            f"first batch) {asyn.extra['steady_traj_per_s']:.2f} traj/s at "
            f"{100 * asyn.extra['steady_engine_busy']:.1f}% engine busy; max staleness taken "
            f"{asyn.extra['staleness_max']}; {o['stale_dropped']} of {o['groups_emitted']} finished "
            f"groups dropped as stale ({100 * o['stale_dropped'] / max(o['groups_emitted'], 1):.0f}%)"
        )
        print(f"       orchestrator stats: {o}")
    for asyn in runs:
        ratio = asyn.traj_per_s / sync.traj_per_s
        print(
            f"RATIO async (max_staleness {asyn.extra['max_staleness']}) / sync throughput "
            f"{ratio:.2f}x, steady state {asyn.extra['steady_traj_per_s'] / sync.traj_per_s:.2f}x "
            f"(goal >= 3x); engine busy {100 * sync.engine_busy:.1f}% -> "
            f"{100 * asyn.engine_busy:.1f}%, steady state {100 * asyn.extra['steady_engine_busy']:.1f}% "
            f"(goal >= 90%)"
        )
    service = []
    if p.service:
        service = await run_service(engine, template, p, params, runs[0])
        # The in-process run again: on a shared machine the load drifts between runs, so
        # each service run is also compared with the mean of the in-process runs around it.
        again = await run_async(engine, template, p, params, engine.version, p.max_staleness[0])
        print(again.line().replace("RESULT async", "RESULT again", 1))
        # The faster of the two is the reference: a run slowed by compiles or a burst of
        # load elsewhere must not flatter the service.
        best = max(runs[0].traj_per_s, again.traj_per_s)
        for res in service:
            nodes = res.extra["nodes"]
            print(
                f"RATIO service ({nodes} node{'s' if nodes > 1 else ''}) / the faster in-process "
                f"run (before {runs[0].traj_per_s:.2f}, after {again.traj_per_s:.2f} traj/s): "
                f"{res.traj_per_s / best:.2f}x"
            )
    print(f"compiles during the runs: {_diff(engine.compiles, compiles0)}")
    asyn = runs[0]
    ratio = asyn.traj_per_s / sync.traj_per_s
    await engine.close()
    return {
        "sync": dataclasses.asdict(sync),
        "async": dataclasses.asdict(asyn),
        "sweep": [dataclasses.asdict(r) for r in runs],
        "service": [dataclasses.asdict(r) for r in service],
        "ratio": ratio,
        "tool_use_after_sft": tool_use,
        "sft_steps": steps,
    }


# ------------------------------------------------------------------ service
async def run_service(
    engine: JaxEngine, template: ChatTemplate, p: BenchParams, params: Any, local: ModeResult
) -> list[ModeResult]:
    """The async workload (first staleness bound) through one rollout node, then through
    ``p.service`` nodes; prints each and its ratio to the in-process run ``local``."""
    server, port = await start_server(engine)
    procs: list[subprocess.Popen] = []
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-nodes-") as tmp:
            for count in sorted({1, p.service}):
                while len(procs) < count:
                    procs.append(_spawn_node(p, Path(tmp) / f"node-{len(procs)}"))
                urls = [_url_of(proc) for proc in procs[:count]]
                res = await run_async(
                    engine,
                    template,
                    p,
                    params,
                    engine.version,
                    p.max_staleness[0],
                    nodes=urls,
                    engine_url=f"http://127.0.0.1:{port}",
                )
                res.extra["nodes"] = count
                results.append(res)
                print(res.line())
                print(
                    f"RATIO service ({count} node{'s' if count > 1 else ''}) / in-process async "
                    f"throughput {res.traj_per_s / local.traj_per_s:.2f}x (goal >= 0.90 for one "
                    f"node), steady state "
                    f"{res.extra['steady_traj_per_s'] / local.extra['steady_traj_per_s']:.2f}x; "
                    f"engine busy {100 * local.engine_busy:.1f}% -> {100 * res.engine_busy:.1f}%"
                )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await server.cleanup()
    return results


def _spawn_node(p: BenchParams, state_dir: Path) -> subprocess.Popen:
    """A ``serve-rollout`` process with the benchmark's environment, pools and config."""
    w = p.waits
    source = (
        "tasks=[{name: arithmetic, env: bench_slow_arithmetic, tasks_from: arithmetic, "
        f"env_kwargs: {{reset_s: {w.reset_s}, tool_mean_s: {w.tool_mean_s}, "
        f"tool_sigma: {w.tool_sigma}, eval_s: {w.eval_s}, seed: {p.seed}}}}}]"
    )
    overrides = [
        *p.overrides,
        "env.import=profiling.bench_env",  # found from the node's working directory
        source,
        f"rollout.group_size={p.group_size}",
        *(f"rollout.{k}_workers={p.pool}" for k in ("init", "run", "eval")),
        f"rollout.seed={p.seed}",
    ]
    argv = [sys.executable, "-m", "tunix_agentic.cli.main", "serve-rollout"]
    argv += ["--config", str(CONFIG), "--port", "0", "--state-dir", str(state_dir)]
    if p.node_max_groups is not None:
        argv += ["--max-groups", str(p.node_max_groups)]
    argv += overrides
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, text=True, env={**env, "JAX_PLATFORMS": "cpu"}
    )


def _url_of(proc: subprocess.Popen) -> str:
    """The URL a node prints once it listens (remembered: asked again, the same)."""
    url = getattr(proc, "bench_url", None)
    if url is None:
        line = proc.stdout.readline()
        if not line.startswith("serving rollout node on "):
            raise SystemExit(f"serve-rollout did not start: {line!r} (exit {proc.poll()})")
        url = proc.bench_url = line.split()[-1]
    return url


def _engine_other(
    engine: JaxEngine, since: dict[str, float] | None = None, wall: float | None = None
) -> dict[str, float]:
    """The engine's host-gap, idle and void-chunk seconds, or their fractions of ``wall`` since."""
    clock = engine.clock()
    now = {
        "engine_sched_gap": clock["sched_gap_s"],
        "engine_idle": clock["idle_s"],
        "engine_void": engine.stats["void_s"],
    }
    if since is None:
        return now
    return {k: (v - since[k]) / wall for k, v in now.items()}


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def parse_args(argv: list[str] | None) -> BenchParams:
    d, w = BenchParams(), Waits.from_env()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trajectories", type=int, default=env_int("BENCH_TRAJECTORIES", d.trajectories)
    )
    ap.add_argument("--group-size", type=int, default=env_int("BENCH_GROUP_SIZE", d.group_size))
    ap.add_argument(
        "--groups-per-batch",
        type=int,
        default=env_int("BENCH_GROUPS_PER_BATCH", d.groups_per_batch),
    )
    ap.add_argument("--sft-steps", type=int, default=env_int("BENCH_SFT_STEPS", d.sft_steps))
    ap.add_argument("--sft-batch", type=int, default=env_int("BENCH_SFT_BATCH", d.sft_batch))
    ap.add_argument("--min-tool-use", type=float, default=d.min_tool_use)
    ap.add_argument("--train-s", type=float, default=env_float("BENCH_TRAIN_S", d.train_s))
    ap.add_argument("--pool", type=int, default=env_int("BENCH_POOL", d.pool))
    ap.add_argument(
        "--max-staleness",
        default=os.environ.get("BENCH_MAX_STALENESS", ",".join(map(str, d.max_staleness))),
        help="one bound or a comma list (one async run each), e.g. 1,2,4",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the config, e.g. --set engine.max_slots=32 (repeatable)",
    )
    ap.add_argument(
        "--prefetch-groups",
        type=int,
        default=env_int("BENCH_PREFETCH_GROUPS", d.prefetch_groups),
        help="async: groups whose sandboxes start ahead of admission (0: off)",
    )
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--seed", type=int, default=env_int("BENCH_SEED", d.seed))
    ap.add_argument("--reset-s", type=float, default=w.reset_s)
    ap.add_argument("--tool-mean-s", type=float, default=w.tool_mean_s)
    ap.add_argument("--tool-sigma", type=float, default=w.tool_sigma)
    ap.add_argument("--eval-s", type=float, default=w.eval_s)
    ap.add_argument(
        "--service",
        type=int,
        default=env_int("BENCH_SERVICE", d.service),
        metavar="N",
        help="also run the async workload through 1 rollout node and through N (0: off)",
    )
    ap.add_argument(
        "--node-max-groups",
        type=int,
        default=None,
        metavar="N",
        help="service: serve-rollout --max-groups N (default: the node's, every stage pool's "
        "worth of groups; 8 here is the cap of one RUN pool the nodes had before)",
    )
    a = ap.parse_args(argv)
    return BenchParams(
        trajectories=a.trajectories,
        group_size=a.group_size,
        groups_per_batch=a.groups_per_batch,
        sft_steps=a.sft_steps,
        sft_batch=a.sft_batch,
        min_tool_use=a.min_tool_use,
        train_s=a.train_s,
        pool=a.pool,
        max_staleness=_bounds(a.max_staleness),
        prefetch_groups=a.prefetch_groups,
        overrides=tuple(a.set),
        warmup=not a.no_warmup,
        seed=a.seed,
        waits=Waits(a.reset_s, a.tool_mean_s, a.tool_sigma, a.eval_s),
        service=a.service,
        node_max_groups=a.node_max_groups,
    )


def _bounds(text: str) -> tuple[int, ...]:
    try:
        bounds = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise SystemExit(
            f"--max-staleness: expected integers like 1 or 1,2,4, got {text!r}"
        ) from None
    if not bounds or min(bounds) < 0:
        raise SystemExit(f"--max-staleness: expected integers >= 0, got {text!r}")
    return bounds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both modes; returns the figures it printed."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
