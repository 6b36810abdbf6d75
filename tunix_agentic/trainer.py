"""The training run: SFT warm start, held-out evaluation, asynchronous GRPO, checkpoint.

:class:`Trainer` builds a run in one place (``_build``: every piece's lifetime
on an ``AsyncExitStack``), then drives it: evaluation, the RL loop of
:mod:`tunix_agentic.rl_loop` (shared with ``profiling/bench_rollout.py``),
checkpoints, and a clean stop on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import jax
import yaml
from tqdm.auto import tqdm

from tunix_agentic.checkpoint import Checkpointer, set_aside
from tunix_agentic.config import (
    ConfigError,
    RunConfig,
    load_config,
    resolve_model,
    save_config,
    to_dict,
)
from tunix_agentic.evaluation import EvalResult, evaluate, evaluate_beside_training, log_eval
from tunix_agentic.inference.base import EngineError, InferenceEngine, WeightUpdate
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.metrics.engine import EngineWindow
from tunix_agentic.metrics.hparams import write_hparams
from tunix_agentic.metrics.layout import LayoutWriter
from tunix_agentic.metrics.mfu import StepMfu, param_count, peak_flops
from tunix_agentic.metrics.recorder import MetricsRecorder, drop_records
from tunix_agentic.metrics.step_time import StepTime
from tunix_agentic.metrics.trace import ProfileSteps, Timeline, open_timeline
from tunix_agentic.metrics.wandb_mirror import WandbMirror
from tunix_agentic.models.hf import build_model
from tunix_agentic.models.tokenizers import load_tokenizer
from tunix_agentic.models.transformer import count_params
from tunix_agentic.resume import logged_after, restore_newest
from tunix_agentic.rl_loop import PeriodicEval, StepReport, run_rl_steps
from tunix_agentic.rollout.client.connect import connect_service
from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator
from tunix_agentic.rollout.stats import rollout_stats
from tunix_agentic.rollout.transcripts import TranscriptLog
from tunix_agentic.run_context import GRPOSteps, RunCheckpoints, RunContext, cpu_seconds
from tunix_agentic.run_setup import (
    build_engine,
    chat_template,
    in_process_engines,
    run_sources,
    warm_start,
)
from tunix_agentic.signals import RunInterrupted, Stopped, StopSignals

_log = logging.getLogger(__name__)
_GIVE_RETRY_S = 3.0  # how often the starting weights are offered again to servers not ready


@dataclasses.dataclass
class TrainResult:
    """A finished run. ``success_*``: the held-out success rate (the share of episodes
    with reward > 0) before and after RL; ``reward_*``: the held-out mean reward."""

    run_dir: str
    success_before: float
    success_after: float
    steps: int
    seconds: float
    history: list[dict[str, float]]
    # Held-out success per task source, before and after (several sources only).
    by_task_before: dict[str, float] = dataclasses.field(default_factory=dict)
    by_task_after: dict[str, float] = dataclasses.field(default_factory=dict)
    reward_before: float = 0.0
    reward_after: float = 0.0
    # CPU time of this process (every thread) and its ended children, resumed runs' added
    cpu_seconds: float = 0.0

    def summary(self) -> str:
        line = (
            f"held-out success: {self.success_before:.2f} -> {self.success_after:.2f} "
            f"({self.steps} steps, {_minutes(self.seconds)} wall, "
            f"{_minutes(self.cpu_seconds)} CPU; success: the share of episodes with "
            "reward > 0)"
            f"\nheld-out mean reward: {self.reward_before:.2f} -> {self.reward_after:.2f}"
        )
        if len(self.by_task_after) > 1:
            line += "".join(
                f"\n  {name}: {self.by_task_before.get(name, 0.0):.2f} -> {after:.2f}"
                for name, after in self.by_task_after.items()
            )
        return line


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def fresh_run_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... if a run already lives there: never overwrite one."""
    candidate, n = path, 1
    while (candidate / "config.yaml").exists() or (candidate / "checkpoints").exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


class Trainer:
    """One run, from a config. ``run()`` is synchronous and notebook-friendly.

    Fault tolerance: a checkpoint (orbax, written in the background) follows the
    warm start, every ``rl.checkpoint_every`` RL steps and the last step; a
    ``resume`` continues from the newest one at that step, with the task stream,
    the metrics logs and the run's clock as they were there (a newest checkpoint
    that cannot be read is skipped for the one before). SIGINT/SIGTERM stop
    admitting, checkpoint the last finished step, close everything and raise
    :class:`RunInterrupted`; an error checkpoints the last finished step too, then
    propagates. Engine, checkpointer and event writer are closed on every path.
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: bool = False,
        progress: bool = True,
        profile_steps: ProfileSteps | None = None,
    ):
        self.cfg = config = resolve_model(config)
        self.profile_steps = profile_steps  # jax.profiler over these RL steps
        self.resume = resume
        self.progress = progress
        self.run_dir = Path(config.run_dir) if resume else fresh_run_dir(Path(config.run_dir))
        if self.run_dir != Path(config.run_dir):
            self.cfg = config = dataclasses.replace(config, run_dir=str(self.run_dir))
        model = config.model
        self.tokenizer = load_tokenizer(model.source, model.path, model.vocab_size)
        self.template = chat_template(config, self.tokenizer)
        self.sources = run_sources(config, self.template, profile_steps)  # checked before work
        self.env_factory = self.sources.make_env
        # The run's engine once built (closed when the run ends).
        self.engine: InferenceEngine | None = None
        # The rollout nodes' client once built (rollout.service.urls): its outcomes and counts.
        self.rollout_service: ServiceEpisodeRunner | None = None
        self._signals: StopSignals | None = None
        self.checkpoints = RunCheckpoints(to_dict(self.cfg.model))

    # ------------------------------------------------------------- pieces
    async def evaluate(
        self, orchestrator: RolloutOrchestrator, n: int, *, beside_training: bool = False
    ) -> EvalResult:
        """``n`` held-out tasks of every source, greedy by default (:mod:`~.evaluation`);
        ``beside_training``: production runs meanwhile (``rl.eval_priority`` applies)."""
        agent = dataclasses.replace(self.cfg.agent, temperature=self.cfg.rl.eval_temperature)
        if beside_training:
            return await evaluate_beside_training(
                orchestrator,
                self.sources,
                n,
                seed=self.cfg.seed,
                agent_config=agent,
                template=self.template,
                priority=self.cfg.rl.eval_priority,
            )
        return await evaluate(
            orchestrator,
            self.sources,
            n,
            seed=self.cfg.seed,
            agent_config=agent,
            template=self.template,
        )

    # ---------------------------------------------------------------- run
    def run(self) -> TrainResult:
        """Run to the end (blocking). Inside a running event loop (Jupyter, Colab) the run
        gets a thread and a loop of its own; interrupting the kernel then stops it the way
        Ctrl-C does (the step under way finishes, it is checkpointed, RunInterrupted is
        raised), and a second interrupt returns at once, leaving the run's thread to end."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            in_loop = False
        else:
            in_loop = True
        if not in_loop:  # outside the except: a run's error is not chained to "no loop"
            return asyncio.run(self._run())
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tunix-run")
        future = pool.submit(asyncio.run, self._run())
        try:
            try:
                return future.result()
            except KeyboardInterrupt:
                if self._signals is None:
                    raise
                self._signals.request(signal.SIGINT)
                return future.result()  # raises RunInterrupted once the run has stopped
        finally:
            pool.shutdown(wait=False)

    async def _run(self) -> TrainResult:
        loop = asyncio.get_running_loop()
        with StopSignals(loop) as signals:
            self._signals = signals
            try:
                async with contextlib.AsyncExitStack() as stack:
                    return await self._run_in(stack)
            except Stopped:
                pass  # the stack has closed everything, the last step's checkpoint included
            raise RunInterrupted(
                signals.signum or signal.SIGINT, self.checkpoints.done_step, self.run_dir
            )

    async def _build(self, stack: contextlib.AsyncExitStack) -> tuple[RunContext, dict[str, Any]]:
        """Build the run, every piece's lifetime on ``stack``: model (restored, or warm-started
        by SFT), learner, engine (compiled on a second thread beside SFT), metrics,
        checkpointer, task stream and orchestrator. Returns them and the checkpoint's
        metadata (empty on a fresh run)."""
        cfg = self.cfg
        model = build_model(cfg.model, seed=cfg.seed)
        restored = restore_newest(self.run_dir, cfg, model, self.sources) if self.resume else None
        # Nothing was written before this line: a resume that failed above changed nothing.
        meta: dict[str, Any] = restored.meta if restored else {}
        start_step = restored.step if restored else 0
        t_start = time.perf_counter() - float(meta.get("elapsed_s", 0.0))
        cpu_start = cpu_seconds() - float(meta.get("cpu_s", 0.0))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        if self.resume:
            # What was logged after the checkpoint is redone below: drop it (all of it when
            # there was no checkpoint and the run starts over), by step, never by clock.
            drop_records(
                self.run_dir / "tensorboard", logged_after(start_step if restored else None)
            )
            set_aside(
                self.run_dir / "checkpoints",
                restored.unreadable if restored else [],
                self.run_dir / "checkpoints_unreadable",
            )
        metrics, timeline = _open_metrics(stack, cfg, self.run_dir, start_step, self.profile_steps)
        self.step_time = StepTime()  # where each RL step's time went
        metrics.add_span_listener(self.step_time)
        ckpt = Checkpointer(self.run_dir / "checkpoints", max_to_keep=cfg.rl.keep_checkpoints)
        stack.callback(ckpt.close)  # runs before metrics.close: pending writes finish first
        self._log(f"model: {count_params(model):,} parameters; run dir {self.run_dir}")
        if restored:
            learner = restored.learner
            model = learner.policy_model()
            self.checkpoints.resumed_at(start_step)
            self._log(f"resumed from step {start_step}")
        elif self.resume:
            self._log(f"no checkpoint under {ckpt.directory}: starting fresh")
        tasks = self.sources.train_stream(cfg.seed)
        ray_engines = self._ray_engine_fleet = await self._ray_engines(stack)
        engine_urls = ray_engines.urls if ray_engines else ()
        engine = self.engine = build_engine(cfg, model, start_step, engine_urls=engine_urls)
        stack.push_async_callback(engine.close)
        if ray_engines is not None:  # an engine Ray restarts elsewhere: the pool follows it
            ray_engines.moved_to.append(engine.repoint)
        # Engine servers (named, or the run's Ray engines): nothing to compile here.
        external = bool(cfg.rollout.service.engine_urls or engine_urls or cfg.engine.urls)
        members = in_process_engines(engine)  # what compiles here (none: servers)
        engine.use_tokenizer(self.tokenizer)  # constrained decoding, for the nodes' endpoint
        # The engine compiles its shapes on another thread, beside SFT on a fresh run; it
        # gets the SFT weights afterwards (shapes do not depend on the values).
        warm = asyncio.get_running_loop().run_in_executor(
            None, _warm_up, members, cfg.engine.warmup
        )
        stack.push_async_callback(_settle, warm)  # never leave the compile thread behind
        if not restored:
            with metrics.span("sft"):
                model = warm_start(
                    cfg,
                    self.sources,
                    self.template,
                    model,
                    metrics,
                    progress=self.progress,
                    stop_requested=lambda: bool(self._signals and self._signals.requested),
                )
            learner = GRPOLearner(model, cfg.learner, seed=cfg.seed)
        wait_s = cfg.rollout.backend_wait_s if external else None  # servers: until they load
        if not restored or external:  # servers hold whatever they were started with
            await self._signals.race(
                _give_weights(members or [engine], learner, start_step, metrics, wait_s=wait_s)
            )
        with metrics.span("engine_warmup_wait"):
            warmed = await self._signals.race(asyncio.shield(warm))
        if warmed:
            self._log(
                f"engine warm-up: {warmed['shapes']:.0f} shapes compiled in "
                f"{warmed['seconds']:.0f}s on a second thread"
            )
        # On rollout nodes (rollout.service.urls, rollout.ray) their runner runs the groups.
        runner = self.rollout_service = await self._node_runner(stack, engine, start_step)
        if runner is None:
            orch = RolloutOrchestrator.in_process(
                engine,
                self.env_factory,
                self.template,
                cfg.agent,
                cfg.rollout,
                tasks=tasks,
                metrics=metrics,
            )
        else:
            orch = RolloutOrchestrator(runner, cfg.rollout, tasks=tasks, metrics=metrics)
        orch.set_version(start_step)
        if restored:
            orch.restore_state(meta["rollout"])
        ctx = RunContext(learner, orch, engine, ckpt, metrics, t_start, start_step, timeline)
        ctx.cpu_start = cpu_start
        ctx.transcripts = TranscriptLog(self.run_dir, self.template, cfg.agent.parser, metrics)
        return ctx, meta

    async def _ray_engines(self, stack: contextlib.AsyncExitStack) -> Any:
        """The run's engine servers on Ray (``rollout.ray.engines``: a
        :class:`~tunix_agentic.cluster.fleet.RayEngines`), started here and stopped by
        ``stack``; None when the run starts none."""
        ray = self.cfg.rollout.ray
        if not (ray.enabled or ray.engines):
            return None
        from tunix_agentic.cluster.fleet import run_name

        self._ray_name = run_name(self.run_dir.name)  # one id for the run's actors
        if not ray.engines:
            return None
        from tunix_agentic.cluster.connect import start_ray_engines

        return await start_ray_engines(stack, self.cfg, name=self._ray_name, log=self._log)

    async def _node_runner(
        self, stack: contextlib.AsyncExitStack, engine: InferenceEngine, version: int
    ) -> ServiceEpisodeRunner | None:
        """The connected runner of groups on rollout nodes (Ray actors the trainer starts,
        or ``rollout.service.urls``), closed by ``stack``; None: groups run in process."""
        cfg = self.cfg
        info = {"model_path": f"tunix-agentic run {self.run_dir.name}"}
        api = "vllm" if cfg.engine.backend == "vllm" else "sglang"  # what the engines speak
        kw = {"version": version, "model_info": info, "engine_api": api}
        if cfg.rollout.ray.enabled:  # rollout nodes the trainer starts as Ray actors
            from tunix_agentic.cluster.connect import connect_ray_nodes

            fleet = self._ray_engine_fleet
            runner = await connect_ray_nodes(
                stack,
                engine,
                cfg,
                name=self._ray_name,
                log=self._log,
                engine_urls=fleet.urls if fleet else (),  # where they are now
                **kw,
            )
            if fleet is not None:  # the nodes follow a moved engine too
                fleet.moved_to.append(runner.replace_engine)
            return runner
        if cfg.rollout.service.enabled:
            return await connect_service(stack, engine, cfg.rollout, cfg.agent, **kw)
        return None

    async def _run_in(self, stack: contextlib.AsyncExitStack) -> TrainResult:
        cfg = self.cfg
        ctx, meta = await self._build(stack)
        restored, start_step = bool(meta), ctx.start_step
        orch, metrics = ctx.orch, ctx.metrics
        # From here on a stop signal or an error saves the last finished step before the
        # stack closes (the checkpointer, closed after, finishes the write).
        stack.push(functools.partial(self.checkpoints.save_on_exit, ctx))
        if restored:
            before = float(meta["success_before"])
            by_task_before = dict(meta.get("success_before_by_task", {}))
            ctx.reward_before = float(meta.get("reward_before", before))
        else:
            with metrics.span("eval", per_step=False):  # for the trace: logged at its step
                ev = await self._signals.race(self.evaluate(orch, cfg.rl.eval_tasks))
            before, by_task_before, ctx.reward_before = ev.success, ev.by_task, ev.reward
            log_eval(metrics, ev, start_step, ctx.transcripts)
            # The warm start's and this evaluation's spans at step 0, not RL step 1's.
            metrics.write_step(start_step)
        ctx.before, ctx.by_task_before = before, by_task_before
        if not restored:
            self.checkpoints.done_step = 0
            self.checkpoints.save(ctx, 0)  # the warm start is never redone
        self._log(f"held-out success before RL: {before:.3f}, mean reward {ctx.reward_before:.3f}")

        history = await self._rl_loop(ctx, ctx.engine, start_step)
        final_step = max(cfg.rl.steps, start_step)
        self.checkpoints.save(ctx, final_step)
        with metrics.span("eval", per_step=False):
            after_eval = await self._signals.race(self.evaluate(orch, cfg.rl.eval_tasks))
        log_eval(metrics, after_eval, final_step, ctx.transcripts)
        return _finish(self.run_dir, cfg.rl.steps, ctx, after_eval, history)

    async def _rl_loop(
        self, ctx: RunContext, engine: InferenceEngine, start_step: int
    ) -> list[dict]:
        cfg = self.cfg
        metrics = ctx.metrics
        history: list[dict[str, float]] = []
        if start_step >= cfg.rl.steps:
            return history
        bar = tqdm(
            total=cfg.rl.steps,
            initial=start_step,
            desc="GRPO",
            disable=not self.progress,
            file=sys.stderr,
        )
        window = EngineWindow(engine)  # the engine's figures per step, from the start of RL
        mfu = _step_mfu(ctx, cfg, start_step)  # logs perf/peak_flops_per_s
        layouts = LayoutWriter()

        def on_step(report: StepReport) -> None:
            step, groups, out = report.step, report.groups, report.out
            stats = rollout_stats(groups)
            scalars = _step_scalars(report, stats, window, self.step_time, mfu)
            history.append(metrics.write_step(step, scalars))
            if cfg.metrics.layout:
                layouts.after_step(metrics, step)  # the custom-scalars dashboard, charts with data
            ctx.transcripts.write_step(step, groups)  # a few episodes, to read (tunix-agentic show)
            ctx.timeline.begin_step(step + 1)  # the step's trace to disk; the profile window
            self.checkpoints.step_done(ctx, step)
            bar.update(1)
            bar.set_postfix(
                reward=f"{stats.get('rollout/reward_mean', 0):.2f}", loss=f"{out['loss']:.3f}"
            )
            every = cfg.rl.checkpoint_every
            if every and step % every == 0:
                self.checkpoints.save(ctx, step)
            if self._signals.requested:
                raise Stopped

        ctx.steps = GRPOSteps(ctx.learner, cfg, self.tokenizer.pad_id)
        ctx.timeline.begin_step(start_step + 1)
        try:
            await run_rl_steps(
                ctx.orch,
                engine,
                ctx.steps,
                start_step=start_step,
                steps=cfg.rl.steps,
                on_step=on_step,
                race=self._signals.race,  # a step under way finishes (and is kept) after a signal
                metrics=metrics,
                periodic=_periodic_eval(self, ctx) if cfg.rl.eval_every else None,
            )
        finally:
            bar.close()
        return history

    def _log(self, msg: str) -> None:
        if self.progress:
            tqdm.write(msg, file=sys.stderr)


def _periodic_eval(trainer: Trainer, ctx: RunContext) -> PeriodicEval:
    """``rl.eval_every``: evaluations beside training, logged at the version they measure
    (with ``eval/wall_s``; a due step never on the engine logs ``eval/skipped``)."""
    metrics, every = ctx.metrics, trainer.cfg.rl.eval_every

    async def run(version: int) -> EvalResult:
        # The learner's eval track of the trace, beside the steps; logged at its version.
        with metrics.span("eval", per_step=False), trainer.step_time.evaluating():
            return await trainer.evaluate(ctx.orch, trainer.cfg.rl.eval_tasks, beside_training=True)

    return PeriodicEval(
        every,
        run,
        lambda v, ev: log_eval(metrics, ev, v, ctx.transcripts),
        lambda v: metrics.scalar("eval/skipped", 1.0, v),
    )


def _finish(
    run_dir: Path, steps: int, ctx: RunContext, after: EvalResult, history: list[dict]
) -> TrainResult:
    """The run's result, also written to ``run_dir/summary.json`` with the last
    evaluation's figures (its transcripts are in ``run_dir/transcripts``)."""
    result = TrainResult(
        run_dir=str(run_dir),
        success_before=ctx.before,
        success_after=after.success,
        steps=steps,
        seconds=time.perf_counter() - ctx.t_start,
        cpu_seconds=cpu_seconds() - ctx.cpu_start,
        history=history,
        by_task_before=ctx.by_task_before,
        by_task_after=after.by_task,
        reward_before=ctx.reward_before,
        reward_after=after.reward,
    )
    figures = {k: v for k, v in dataclasses.asdict(after).items() if k != "transcripts"}
    summary = {**dataclasses.asdict(result), "history": None, "eval_after": figures}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return result


def _open_metrics(
    stack: contextlib.AsyncExitStack,
    cfg: RunConfig,
    run_dir: Path,
    start_step: int,
    profile_steps: ProfileSteps | None,
) -> tuple[MetricsRecorder, Timeline]:
    """The run's metrics recorder (TensorBoard, with a W&B mirror and the dashboard layout
    as configured) and its timeline (trace and profiler), both closed by ``stack``."""
    metrics = MetricsRecorder(
        run_dir / "tensorboard",
        max_samples=cfg.metrics.latency_samples,
        run_name=run_dir.name,  # what TensorBoard calls the run
    )
    stack.callback(metrics.close)
    if cfg.metrics.wandb.project is not None:
        mirror = WandbMirror(cfg.metrics.wandb, run_dir, to_dict(cfg))
        stack.callback(mirror.close)  # once the run is done writing (LIFO)
        metrics.add_write_listener(mirror)
    write_config_card(metrics, cfg, start_step)  # the resolved config, in the text plugin
    write_hparams(metrics, to_dict(cfg), start_step, trial_id=run_dir.name)  # HPARAMS plugin
    timeline = open_timeline(
        run_dir, cfg.trace, metrics, step=start_step, profile_steps=profile_steps
    )
    stack.callback(timeline.close)  # before metrics.close; on every path, errors included
    return metrics, timeline


def _step_mfu(ctx: RunContext, cfg: RunConfig, step: int) -> StepMfu:
    """The model's size and the peak FLOP/s of the run's MFU; the peak logged at ``step``
    (``perf/peak_flops_per_s``, measured here on CPU)."""
    model, learner = cfg.model, ctx.learner
    mfu = StepMfu(
        n_params=param_count(learner.state.params, learner.base),  # LoRA: base and adapters
        peak=peak_flops(cfg.metrics.peak_flops),
        layers=model.num_layers,
        attn_dim=model.num_heads * model.head_dim,
    )
    ctx.metrics.scalar("perf/peak_flops_per_s", mfu.peak, step)
    return mfu


def _step_scalars(
    report: StepReport,
    stats: dict[str, float],
    window: EngineWindow,
    step_time: StepTime,
    mfu: StepMfu,
) -> dict[str, float]:
    """What an RL step logs besides its step number: the rollout's figures (``stats``), the
    learner's, the batch's staleness, throughput, the engine's, where the step's time went,
    MFU and peak memory."""
    parts = step_time.parts(
        report.wait_start,
        report.wait_start + report.wait_s,
        train_s=report.train_s,
        sync_s=report.sync_s,
        other_s=report.other_s,
    )
    versions = [
        t.min_version for g in report.groups for t in g.trajectories if t.min_version is not None
    ]
    engine = window.scalars()
    seq_lens = [len(t.token_ids) for g in report.groups for t in g.trajectories]
    train_s = 0.0 if report.out.get("learner/skipped_steps") else report.train_s  # no update
    return {
        **stats,
        **{f"learner/{k.removeprefix('learner/')}": v for k, v in report.out.items()},
        # Policy lag of the trained tokens: versions behind the policy trained.
        "rollout/staleness_versions_max": float(report.step - 1 - min(versions))
        if versions
        else 0.0,
        "throughput/generated_tokens_per_s": stats.get("rollout/generated_tokens", 0.0)
        / report.wall_s,
        **engine,
        **mfu.scalars(
            seq_lens, train_s, engine.get("throughput/generated_tokens_per_accelerator_s")
        ),
        **peak_memory(),
        **parts,
    }


def peak_memory() -> dict[str, float]:
    """``perf/peak_host_memory_gib`` (this process's peak resident memory) and, where the
    device reports it (an accelerator), ``perf/peak_device_memory_gib``."""
    out = {"perf/peak_host_memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["perf/peak_device_memory_gib"] = stats["peak_bytes_in_use"] / 2**30
    return out


def write_config_card(metrics: MetricsRecorder, cfg: RunConfig, step: int) -> None:
    """The resolved config as YAML in TensorBoard's text plugin (``config/resolved``)."""
    from tensorboard.plugins.text.summary_v2 import text_pb

    body = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    text = "\n".join("    " + line for line in body.splitlines())  # a Markdown code block
    metrics.write_summaries(list(text_pb("config/resolved", text).value), step)


async def _give_weights(
    engines: list,
    learner: GRPOLearner,
    version: int,
    metrics: MetricsRecorder,
    *,
    wait_s: float | None = None,
) -> None:
    """The run's starting weights to its engines; with ``wait_s`` (engine servers, which
    load them over seconds: nothing may be sampled before) until they hold them. Servers
    that cannot take them yet (one Ray is restarting) are asked again every few seconds
    for up to ``wait_s``; then a ConfigError (the run cannot sample its own policy)."""
    params = learner.params_for_engine()
    updates = [e.update_weights(params, version) for e in engines]
    if wait_s is None:
        return
    deadline, update = time.monotonic() + wait_s, updates[0]
    with metrics.span("weight_sync"):
        while True:
            try:
                await WeightUpdate.of(update, version)
                return
            except EngineError as exc:
                if time.monotonic() >= deadline:
                    raise ConfigError(
                        f"the engine servers could not load the run's weights: {exc}"
                    ) from exc
                _log.warning("the engine servers cannot load the run's weights yet: %s", exc)
            await asyncio.sleep(_GIVE_RETRY_S)
            update = engines[0].update_weights(params, version)


async def _settle(fut: asyncio.Future) -> None:
    """Wait for a background future, ignoring its outcome (cleanup only)."""
    await asyncio.gather(fut, return_exceptions=True)


def _warm_up(engines: list[JaxEngine], enabled: bool | None) -> dict[str, float] | None:
    """Compile every engine's shapes ahead of the first request, waiting for the warm-up
    each engine began when built (``engine.warmup: true``) or beginning it (unset);
    ``engine.warmup: false`` leaves each shape to compile when first met."""
    if enabled is False:
        return None
    done = [engine.start_warmup().result() for engine in engines]
    return {"shapes": sum(d["shapes"] for d in done), "seconds": sum(d["seconds"] for d in done)}


def train(
    config_path: str | None,
    overrides: list[str] = (),
    *,
    resume_dir: str | None = None,
    progress: bool = True,
    profile_steps: ProfileSteps | None = None,
) -> TrainResult:
    """Load a config (or a run dir's saved one when resuming) and run it; ``profile_steps``
    takes a ``jax.profiler`` trace of those RL steps into the run's TensorBoard directory.

    Raises :class:`~tunix_agentic.config.ConfigError` for a config that cannot
    run and :class:`RunInterrupted` when SIGINT/SIGTERM stopped the run.
    """
    if resume_dir is not None:
        saved = Path(resume_dir) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(
                f"--resume {resume_dir!r}: no config.yaml there (not a run directory)"
            )
        cfg = load_config(saved, [*overrides, f"run_dir={resume_dir}"])
    else:
        cfg = load_config(config_path, overrides)
    return Trainer(
        cfg, resume=resume_dir is not None, progress=progress, profile_steps=profile_steps
    ).run()
