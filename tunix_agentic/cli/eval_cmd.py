"""``tunix-agentic eval RUN_DIR [--step N] [--tasks K] [--show K]``: a checkpoint's held-out figures.

Restores a run's checkpoint (the newest, or step ``N``) the way ``train --resume``
reads the run (its ``config.yaml``, the policy from ``checkpoints/``; LoRA adapters
merged), evaluates ``K`` held-out tasks of every task source (default: the run's
``rl.eval_tasks``) on one in-process engine, greedy unless the run set
``rl.eval_temperature``, and prints JSON: success (the success rate: the share of
episodes with reward > 0), reward (the mean reward), turns, generated tokens, tool use
and statuses, overall and by task source. ``--show K`` prints ``K`` of the held-out
episodes first (the best, the worst, one cut off at the token limit, ...: see
:mod:`tunix_agentic.rollout.transcripts`), then the JSON. Writes nothing into the run.

:func:`evaluate_checkpoint` is the same from Python (a notebook).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

# What the JSON carries of an evaluation (overall and per task source).
_FIELDS = ("success", "reward", "turns", "generated_tokens", "tool_use", "episodes")


class EvalCommandError(ValueError):
    """The run directory, its checkpoint or the arguments cannot be evaluated (exit 2)."""


@dataclasses.dataclass(frozen=True)
class CheckpointEval:
    """One checkpoint's held-out evaluation: ``step`` and the policy ``version`` it holds,
    ``tasks`` held-out tasks per source, and the figures (``by_task``: per source)."""

    run_dir: str
    step: int
    version: int
    tasks: int
    overall: dict[str, Any]
    by_task: dict[str, dict[str, Any]]
    transcripts: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "step": self.step,
            "version": self.version,
            "tasks_per_source": self.tasks,
            **self.overall,
            "by_task": self.by_task,
        }


def add_eval(sub: Any) -> None:
    """Register ``eval`` on the CLI's sub-parsers."""
    ev = sub.add_parser(
        "eval", help="evaluate a run's checkpoint on the held-out split (prints JSON)"
    )
    ev.add_argument("run_dir", help="the run directory (holding config.yaml and checkpoints/)")
    ev.add_argument(
        "--step", type=int, default=None, metavar="N", help="the checkpoint (default: newest)"
    )
    ev.add_argument(
        "--tasks",
        type=int,
        default=None,
        metavar="K",
        help="held-out tasks per task source (default: the run's rl.eval_tasks)",
    )
    ev.add_argument(
        "--show",
        type=int,
        default=0,
        metavar="K",
        help="print the first K held-out episodes in the tasks' fixed order, the same tasks "
        "at every step (what the model wrote, its tool calls, the rewards), before the JSON",
    )
    ev.set_defaults(handler=eval_command)


def eval_command(args: argparse.Namespace) -> int:
    """The ``eval`` handler: JSON on stdout and 0, or an error on stderr and 2."""
    from tunix_agentic.config import ConfigError

    try:
        result = evaluate_checkpoint(args.run_dir, step=args.step, tasks=args.tasks, show=args.show)
    except (EvalCommandError, ConfigError) as exc:
        print(f"tunix-agentic eval: error: {exc}", file=sys.stderr)
        return 2
    if args.show:
        from tunix_agentic.rollout.transcripts import format_episode, terminal_safe

        shown = result.transcripts[: args.show]
        print(
            f"{len(shown)} held-out episodes of checkpoint {result.step}: the first "
            f"{len(shown)} held-out tasks in their fixed order, as every evaluation of the "
            "run keeps them (neither the best nor the worst)\n"
        )
        for record in shown:
            text = format_episode({"kind": "heldout", "step": result.step, **record})
            print(terminal_safe(text) + "\n")
    print(json.dumps(result.to_json(), indent=2))
    return 0


def evaluate_checkpoint(
    run_dir: str | Path,
    *,
    step: int | None = None,
    tasks: int | None = None,
    show: int = 0,
) -> CheckpointEval:
    """Evaluate checkpoint ``step`` (default: the newest) of the run in ``run_dir`` on
    ``tasks`` held-out tasks per source (default: its ``rl.eval_tasks``); ``show``: keep
    that many of its episodes as transcript records (``transcripts``).

    Raises :class:`EvalCommandError` naming the problem (no run there, no checkpoint,
    an unknown step, with the steps there are) and ConfigError for a run whose config
    cannot be built here.
    """
    from tunix_agentic.checkpoint import Checkpointer
    from tunix_agentic.config import load_config
    from tunix_agentic.trainer import Trainer

    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise EvalCommandError(f"{run}: no config.yaml there (not a run directory)")
    if tasks is not None and tasks < 1:
        raise EvalCommandError(f"--tasks must be >= 1, got {tasks}")
    if show < 0:
        raise EvalCommandError(f"--show must be >= 0, got {show}")
    directory = run / "checkpoints"
    steps: list[int] = []
    if directory.is_dir():  # a Checkpointer would create a missing directory
        ckpt = Checkpointer(directory)
        try:
            steps = ckpt.all_steps()
        finally:
            ckpt.close()
    if not steps:
        raise EvalCommandError(f"{run}: no checkpoint under {directory} (nothing to evaluate)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        listed = ", ".join(str(s) for s in steps)
        raise EvalCommandError(f"--step {step}: {run} has no checkpoint {step} (it has: {listed})")
    cfg = load_config(run / "config.yaml", [f"run_dir={run}"])
    trainer = Trainer(cfg, resume=True, progress=False)  # reads the run, writes nothing
    model, version = _load_policy(run, trainer.cfg, step)
    n = cfg.rl.eval_tasks if tasks is None else tasks
    ev = asyncio.run(evaluate_held_out(trainer, model, version, n, show))
    by_task = {name: _figures(part) for name, part in ev.per_task.items()}
    overall = _figures(ev, statuses=True)
    return CheckpointEval(str(run), step, version, n, overall, by_task, ev.transcripts[:show])


def _figures(ev: Any, *, statuses: bool = False) -> dict[str, Any]:
    out = {name: getattr(ev, name) for name in _FIELDS}
    if statuses:
        out["statuses"] = dict(ev.statuses)
    return out


def _load_policy(run: Path, cfg: Any, step: int) -> tuple[Any, int]:
    """Checkpoint ``step``'s policy (LoRA adapters merged) and its weight version."""
    import jax
    from flax import nnx

    from tunix_agentic.checkpoint import Checkpointer
    from tunix_agentic.learners.lora import init_adapters
    from tunix_agentic.learners.lora import merge as lora_merge
    from tunix_agentic.models.transformer import Transformer

    abstract = nnx.eval_shape(lambda: Transformer(cfg.model, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    lora = cfg.learner.lora
    like: Any = state
    if lora.enabled:
        adapters = jax.eval_shape(lambda: init_adapters(state, lora, jax.random.key(0)))
        like = {"base": state, "adapters": adapters}
    ckpt = Checkpointer(run / "checkpoints")
    try:
        params, meta, step = ckpt.restore_params(like, step)
    finally:
        ckpt.close()
    if lora.enabled:
        params = lora_merge(params["base"], params["adapters"], lora.scale)
    return nnx.merge(graphdef, params), int(meta.get("version", step))


async def evaluate_held_out(trainer: Any, model: Any, version: int, n: int, show: int = 0) -> Any:
    """The held-out evaluation of ``trainer``'s run on one in-process engine holding
    ``model`` at ``version`` (closed after), greedy unless the run set
    ``rl.eval_temperature``, keeping at least ``show`` transcripts."""
    from tunix_agentic.evaluation import evaluate
    from tunix_agentic.inference.engine import JaxEngine
    from tunix_agentic.rollout.orchestrator import RolloutOrchestrator
    from tunix_agentic.rollout.transcripts import HELDOUT_PER_EVAL

    cfg = trainer.cfg
    engine = JaxEngine(model, cfg.engine, version=version)
    try:
        orch = RolloutOrchestrator.in_process(
            engine, trainer.env_factory, trainer.template, cfg.agent, cfg.rollout
        )
        orch.set_version(version)
        agent = dataclasses.replace(cfg.agent, temperature=cfg.rl.eval_temperature)
        return await evaluate(
            orch,
            trainer.sources,
            n,
            seed=cfg.seed,
            agent_config=agent,
            template=trainer.template,
            transcripts=max(show, HELDOUT_PER_EVAL),
        )
    finally:
        await engine.close()
