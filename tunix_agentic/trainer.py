"""The training run: SFT warm start, held-out evaluation, asynchronous GRPO, checkpoint.

The loop only orchestrates. Rollout never stops for training: the
orchestrator keeps producing groups on the event loop while the jitted train
step runs on a worker thread; new weights go to the engine right after each
step (no drain), and admission pacing keeps data within ``max_staleness``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from envs.base import make_env
from learners.batching import grpo_batch
from learners.grpo import GRPOLearner
from learners.sft import SFTTrainer
from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.config import RunConfig, load_config, save_config
from tunix_agentic.data.demos import demonstration_batches
from tunix_agentic.data.mixture import TaskMixture
from tunix_agentic.data.tasks import heldout_tasks, task_iterator
from tunix_agentic.inference.cross_policy import CrossPolicyEngine
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.models.tokenizer import CharTokenizer
from tunix_agentic.models.transformer import Transformer, count_params
from tunix_agentic.rollout.orchestrator import Group, RolloutOrchestrator


@dataclasses.dataclass
class EvalResult:
    success: float
    tool_use: float
    episodes: int
    statuses: dict[str, int]


@dataclasses.dataclass
class TrainResult:
    run_dir: str
    success_before: float
    success_after: float
    steps: int
    seconds: float
    history: list[dict[str, float]]

    def summary(self) -> str:
        m, s = divmod(int(round(self.seconds)), 60)
        return (
            f"held-out success: {self.success_before:.2f} -> {self.success_after:.2f} "
            f"({self.steps} steps, {m}m{s:02d}s)"
        )


def rollout_stats(groups: list[Group]) -> dict[str, float]:
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    rewards = np.asarray([t.reward for t in trajs])
    per_task: dict[str, list[float]] = {}
    for t in trajs:
        per_task.setdefault(t.task_name, []).append(t.reward)
    return {
        **{f"rollout/reward_mean/{name}": float(np.mean(r)) for name, r in per_task.items()},
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/success": float((rewards > 0).mean()),
        "rollout/tool_use": float(np.mean([any(s.tool_calls for s in t.steps) for t in trajs])),
        "rollout/turns_mean": float(np.mean([len(t.steps) for t in trajs])),
        "rollout/generated_tokens": float(sum(t.num_generated for t in trajs)),
        "rollout/trajectories": float(len(trajs)),
    }


def fresh_run_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... if a run already lives there: never overwrite one."""
    candidate, n = path, 1
    while (candidate / "config.yaml").exists() or (candidate / "checkpoints").exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def engine_fractions(
    clock: dict[str, float], start: dict[str, float], since: float
) -> dict[str, float]:
    """``engine/<part>_fraction``: each part's share of the wall time since ``since``."""
    wall = time.perf_counter() - since
    return {
        f"engine/{k.removesuffix('_s')}_fraction": (v - start[k]) / wall for k, v in clock.items()
    }


class Trainer:
    """One run, from a config. ``run()`` is synchronous and notebook-friendly."""

    def __init__(self, config: RunConfig, *, resume: bool = False, progress: bool = True):
        self.cfg = config
        self.resume = resume
        self.progress = progress
        self.run_dir = Path(config.run_dir) if resume else fresh_run_dir(Path(config.run_dir))
        if self.run_dir != Path(config.run_dir):
            self.cfg = config = dataclasses.replace(config, run_dir=str(self.run_dir))
        self.tokenizer = CharTokenizer(config.model.vocab_size)
        self.template = ChatTemplate(self.tokenizer)
        self.env_factory = functools.partial(
            make_env, config.env.name, tool_timeout=config.env.tool_timeout_s
        )

    # ------------------------------------------------------------- pieces
    def warm_start(self, model: Transformer, metrics: MetricsRecorder) -> Transformer:
        cfg = self.cfg.sft
        if cfg.steps == 0:
            return model
        trainer = SFTTrainer(model, cfg.optimizer)
        batches = demonstration_batches(
            self.template,
            seed=self.cfg.seed,
            batch_size=cfg.batch_size,
            tool_fraction=cfg.tool_fraction,
        )
        bar = tqdm(
            range(cfg.steps), desc="SFT warm start", disable=not self.progress, file=sys.stderr
        )
        for step in bar:
            with metrics.span("sft_step"):
                out = trainer.train_step(next(batches))
            if step % 50 == 0 or step == cfg.steps - 1:
                metrics.scalars(
                    {"sft/loss": out["loss"], "sft/token_accuracy": out["token_accuracy"]}, step
                )
                bar.set_postfix(loss=f"{out['loss']:.3f}")
        return trainer.state.model()

    def build_engine(self, model: Transformer, version: int):
        """One JAX engine, or a cross-policy pool of them when configured."""
        engines = [
            JaxEngine(model, self.cfg.engine, version=version)
            for _ in range(1 + self.cfg.cross_policy.stale_engines)
        ]
        if len(engines) == 1:
            return engines[0]
        cp = self.cfg.cross_policy
        return CrossPolicyEngine(
            engines,
            stale_every=cp.stale_every,
            fresh_fraction=cp.fresh_fraction,
            seed=self.cfg.seed,
        )

    async def evaluate(self, orchestrator: RolloutOrchestrator, n: int) -> EvalResult:
        agent = dataclasses.replace(self.cfg.agent, temperature=self.cfg.rl.eval_temperature)
        groups = await orchestrator.run_tasks(
            heldout_tasks(n, seed=self.cfg.seed), agent_config=agent
        )
        trajs = [t for g in groups for t in g.trajectories]
        lost = sum(g.lost for g in groups)
        statuses: dict[str, int] = {}
        for t in trajs + [t for g in groups for t in g.dropped]:
            statuses[t.status] = statuses.get(t.status, 0) + 1
        episodes = len(trajs) + lost  # an episode lost to infrastructure counts as a failure here
        return EvalResult(
            success=sum(t.reward for t in trajs) / episodes if episodes else 0.0,
            tool_use=sum(any(s.tool_calls for s in t.steps) for t in trajs) / episodes
            if episodes
            else 0.0,
            episodes=episodes,
            statuses=statuses,
        )

    # ---------------------------------------------------------------- run
    def run(self) -> TrainResult:
        return asyncio.run(self._run())

    async def _run(self) -> TrainResult:
        cfg = self.cfg
        t_start = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        metrics = MetricsRecorder(self.run_dir / "tensorboard")
        ckpt = Checkpointer(self.run_dir / "checkpoints")
        model = Transformer(cfg.model, rngs=nnx.Rngs(cfg.seed))
        self._log(f"model: {count_params(model):,} parameters; run dir {self.run_dir}")
        tasks = TaskMixture(
            {
                t.name: task_iterator(seed=cfg.seed + t.seed_offset, split="train")
                for t in cfg.tasks
            },
            {t.name: t.weight for t in cfg.tasks},
        )
        meta: dict[str, Any] = {}
        start_step = 0
        learner: GRPOLearner | None = None
        if self.resume and ckpt.latest_step() is not None:
            learner = GRPOLearner(model, cfg.learner)
            params, opt_state, meta, start_step = ckpt.restore(
                learner.state.params, learner.state.opt_state
            )
            learner.state.load(params, opt_state, start_step)
            tasks.set_state(meta["task_iterator"])
            self._log(f"resumed from step {start_step}")
            model = learner.state.model()
        elif self.resume:
            self._log(f"no checkpoint under {ckpt.directory}: starting fresh")
        engine = self.build_engine(model, start_step)
        members = getattr(engine, "engines", [engine])  # a cross-policy pool, or the engine
        # The engine compiles its shapes on another thread, beside SFT on a fresh run; it
        # gets the SFT weights afterwards (shapes do not depend on the values).
        warm = asyncio.get_running_loop().run_in_executor(
            None, _warm_up, members, cfg.engine.warmup
        )
        if learner is None:
            with metrics.span("sft"):
                model = self.warm_start(model, metrics)
            learner = GRPOLearner(model, cfg.learner)
            params = learner.params_for_engine()
            for member in members:
                member.update_weights(params, start_step)
        with metrics.span("engine_warmup_wait"):
            warmed = await warm
        if warmed:
            self._log(
                f"engine warm-up: {warmed['shapes']:.0f} shapes compiled in "
                f"{warmed['seconds']:.0f}s on a second thread"
            )
        orch = RolloutOrchestrator(
            engine,
            self.env_factory,
            self.template,
            cfg.agent,
            cfg.rollout,
            tasks=tasks,
            metrics=metrics,
        )
        orch.set_version(start_step)
        if "success_before" in meta:
            before = float(meta["success_before"])
        else:
            with metrics.span("eval"):
                before = (await self.evaluate(orch, cfg.rl.eval_tasks)).success
            metrics.scalar("eval/success", before, start_step)
        self._log(f"held-out success before RL: {before:.3f}")

        history = await self._rl_loop(
            learner, engine, orch, metrics, ckpt, tasks, start_step, before
        )
        with metrics.span("eval"):
            after_eval = await self.evaluate(orch, cfg.rl.eval_tasks)
        metrics.scalar("eval/success", after_eval.success, max(cfg.rl.steps, start_step))
        metrics.scalar("eval/tool_use", after_eval.tool_use, max(cfg.rl.steps, start_step))
        await engine.close()
        self._save(ckpt, learner, tasks, before, max(cfg.rl.steps, start_step))
        ckpt.close()
        metrics.close()
        result = TrainResult(
            run_dir=str(self.run_dir),
            success_before=before,
            success_after=after_eval.success,
            steps=cfg.rl.steps,
            seconds=time.perf_counter() - t_start,
            history=history,
        )
        (self.run_dir / "summary.json").write_text(
            json.dumps(
                {
                    **dataclasses.asdict(result),
                    "history": None,
                    "eval_after": dataclasses.asdict(after_eval),
                },
                indent=2,
            )
        )
        return result

    async def _rl_loop(
        self, learner, engine, orch, metrics, ckpt, tasks, start_step, before
    ) -> list[dict]:
        cfg = self.cfg
        history: list[dict[str, float]] = []
        if start_step >= cfg.rl.steps:
            return history
        loop = asyncio.get_running_loop()
        train_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")
        rows = cfg.rollout.groups_per_batch * cfg.rollout.group_size
        bar = tqdm(
            range(start_step, cfg.rl.steps),
            desc="GRPO",
            initial=0,
            disable=not self.progress,
            file=sys.stderr,
        )
        orch.start()
        # The engine's clock is read at the start of RL: its fractions are over the run so far
        # (a device call is accounted when collected, so single short steps would be noisy).
        rl_start, engine_at_start = time.perf_counter(), engine.clock()
        try:
            for step in bar:
                t_step = time.perf_counter()
                with metrics.span("wait_for_batch"):
                    groups = await orch.get_batch()
                batch = grpo_batch(
                    groups,
                    learner.advantage_fn,
                    pad_id=self.tokenizer.pad_id,
                    num_rows=rows,
                    task_normalize=cfg.learner.task_normalize,
                )
                with metrics.span("train"):
                    out = await loop.run_in_executor(train_thread, learner.train_step, batch)
                with metrics.span("weight_sync"):
                    engine.update_weights(learner.params_for_engine(), step + 1)
                    orch.set_version(step + 1)
                stats = rollout_stats(groups)
                versions = [
                    t.min_version
                    for g in groups
                    for t in g.trajectories
                    if t.min_version is not None
                ]
                wall = time.perf_counter() - t_step
                extra = {
                    **stats,
                    **{f"learner/{k}": v for k, v in out.items()},
                    "rollout/staleness_max": float(step - min(versions)) if versions else 0.0,
                    "throughput/generated_tokens_per_s": stats.get("rollout/generated_tokens", 0.0)
                    / wall,
                    "throughput/step_s": wall,
                    "engine/busy_s_total": engine.stats["busy_s"],
                    # Where the engine's wall clock went since RL started: device calls,
                    # host-side gaps while work waited, and idle (nothing to generate).
                    **engine_fractions(engine.clock(), engine_at_start, rl_start),
                }
                history.append(metrics.write_step(step + 1, extra))
                bar.set_postfix(
                    reward=f"{stats.get('rollout/reward_mean', 0):.2f}", loss=f"{out['loss']:.3f}"
                )
                every = cfg.rl.checkpoint_every
                if every and (step + 1) % every == 0 and step + 1 < cfg.rl.steps:
                    self._save(ckpt, learner, tasks, before, step + 1)
        finally:
            await orch.stop()
            train_thread.shutdown(wait=True)
        return history

    def _save(
        self, ckpt: Checkpointer, learner: GRPOLearner, tasks, before: float, step: int
    ) -> None:
        if ckpt.latest_step() == step:
            return  # a resumed run with nothing left to do: that step is already saved
        meta = {"success_before": before, "task_iterator": tasks.get_state(), "version": step}
        ckpt.save(step, learner.state.params, learner.state.opt_state, meta)

    def _log(self, msg: str) -> None:
        if self.progress:
            tqdm.write(msg, file=sys.stderr)


def _warm_up(engines: list[JaxEngine], enabled: bool) -> dict[str, float] | None:
    """Compile every engine's shapes ahead of the first request (``engine.warmup: false``
    leaves each to compile when first met)."""
    if not enabled:
        return None
    done = [engine.warmup() for engine in engines]
    return {"shapes": sum(d["shapes"] for d in done), "seconds": sum(d["seconds"] for d in done)}


def train(
    config_path: str | None,
    overrides: list[str] = (),
    *,
    resume_dir: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Load a config (or a run dir's saved one when resuming) and run it."""
    if resume_dir is not None:
        saved = Path(resume_dir) / "config.yaml"
        if not saved.is_file():
            raise ValueError(f"--resume {resume_dir!r}: no config.yaml there (not a run directory)")
        cfg = load_config(saved, [*overrides, f"run_dir={resume_dir}"])
    else:
        cfg = load_config(config_path, overrides)
    return Trainer(cfg, resume=resume_dir is not None, progress=progress).run()
