"""Our side of ``tunix-agentic compare``: the run's own trainer, in its own process
(``python -m tunix_agentic.compare.ours_side JOB.json``), so its peak RSS is its own.

It trains ``rl.steps`` steps with no warm start and keeps the first GRPO batch the
learner trains on (ids, loss mask, the sampler's logprobs, advantages) for the loss
parity check. Held-out success per step comes from the run's own evaluations
(``rl.eval_every=1``: before RL, beside training after each step, after RL), read back
from its ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tunix_agentic.compare.jobs import job_main
from tunix_agentic.compare.machine import xla_threads


def _keep_first_batch(path: Path) -> None:
    """Save the first batch any GRPO learner of this process trains on to ``path``: the
    learner's ``train_step`` is wrapped for this worker process only (it exists to run
    one comparison)."""
    from tunix_agentic.compare.batch import ParityBatch
    from tunix_agentic.learners.grpo import GRPOLearner

    train_step = GRPOLearner.train_step

    def keep(self, batch, **kwargs):
        if not path.exists():
            ParityBatch(
                input_ids=np.asarray(batch.input_ids),
                loss_mask=np.asarray(batch.loss_mask),
                old_logprobs=np.asarray(batch.old_logprobs),
                advantages=np.asarray(batch.advantages),
            ).save(path)
        return train_step(self, batch, **kwargs)

    GRPOLearner.train_step = keep


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def heldout_success(run_dir: str | Path) -> dict[int, float]:
    """``eval/success_fraction`` by the step it was logged at (0: before RL), from the run's
    ``tensorboard/metrics.jsonl``; steps whose version was never on the engine while an
    evaluation could measure it are absent."""
    path = Path(run_dir) / "tensorboard" / "metrics.jsonl"
    out: dict[int, float] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "eval/success_fraction" in row:
            out[int(row["step"])] = float(row["eval/success_fraction"])
    return out


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from tunix_agentic.config import load_config
    from tunix_agentic.trainer import Trainer

    t0 = time.perf_counter()
    batch_path = Path(job["batch"])
    batch_path.unlink(missing_ok=True)  # a batch of an earlier comparison in this dir
    _keep_first_batch(batch_path)
    cfg = load_config(job["config"], job["overrides"])
    result = Trainer(cfg, progress=False).run()
    steps = []
    busy_before = math.nan
    for i, h in enumerate(result.history):
        step_s = _num(h.get("step_time/wall_s"))
        # The engine's device seconds in this step (they overlap training: asynchronous
        # RL): the step's share of its cumulative busy seconds; the first step's from its
        # busy share of the step (the counter includes the evaluation before RL).
        busy = _num(h.get("engine/busy_s_total"))
        if i == 0:
            generation_s = _num(h.get("engine/busy_fraction")) * step_s
        else:
            generation_s = busy - busy_before
        busy_before = busy
        tokens = _num(h.get("rollout/generated_tokens"))
        steps.append(
            {
                "step": i + 1,
                "reward_mean": _num(h.get("rollout/reward_mean")),
                "step_s": step_s,
                # Generation overlaps training (asynchronous RL): what the step waited for it.
                "wait_for_batch_s": _num(h.get("time/wait_for_batch_s")),
                "generation_s": generation_s,
                "train_s": _num(h.get("time/train_s")),
                "weight_sync_s": _num(h.get("time/weight_sync_s")),
                "model_call_s": _num(h.get("time/model_call_s")),
                "generated_tokens": tokens,
                "tokens_per_s": tokens / step_s if step_s > 0 else math.nan,
                "loss": _num(h.get("learner/loss")),
            }
        )
    return {
        "run_dir": result.run_dir,
        "steps": steps,
        "heldout_success": heldout_success(result.run_dir),
        "train_wall_s": result.seconds,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": xla_threads().to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    return job_main(run_job, argv)


if __name__ == "__main__":
    sys.exit(main())
