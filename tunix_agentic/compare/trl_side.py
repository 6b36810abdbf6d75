"""TRL's side of ``tunix-agentic compare``: its ``GRPOTrainer`` on the run's model, tasks
and reward, and its loss on a batch of ours.

Runs in its own process (``python -m tunix_agentic.compare.trl_side JOB.json``) so torch
and JAX never share one and its peak RSS is its own; :func:`trl_loss` is importable for
tests. Needs the ``compare`` extra (``pip install -e .[compare]``): trl, datasets,
accelerate (torch comes with them).

TRL plays the single-turn form of the task: each prompt is our chat template's rendering
of the task (tool schemas included) as plain text, and the reward of a completion is our
environment's reward for that one turn (:class:`SingleTurnReward`).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tunix_agentic.compare.batch import ParityBatch, split_for_trl
from tunix_agentic.compare.jobs import job_main
from tunix_agentic.compare.machine import ThreadSettings, thread_env
from tunix_agentic.config import RunConfig, load_config


@contextlib.contextmanager
def inference_mode(model):
    """``model`` in eval mode without gradients for the block, its mode restored after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def torch_threads() -> dict[str, Any]:
    """This process's torch intra-op threads and thread environment."""
    import torch

    return ThreadSettings(
        "torch",
        torch.get_num_threads(),
        "torch.get_num_threads()",
        thread_env(),
        {"interop": torch.get_num_interop_threads()},
    ).to_dict()


def require_trl() -> None:
    """Raise ImportError with the install command when the ``compare`` extra is missing."""
    try:
        import accelerate  # noqa: F401
        import datasets  # noqa: F401
        import torch  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"comparing against TRL needs the compare extra ({exc.name} is missing): "
            "pip install -e .[compare]"
        ) from None


def single_turn_why(hf_dir: str) -> str:
    """Why TRL plays a multi-turn task's single-turn form, checked against the installed
    TRL and this model's chat template: TRL's ``GRPOTrainer`` runs tool calls
    (``tools=``, ``environment_factory=``) only through the chat template, which must show
    the tools and be one TRL can parse calls from (``add_response_schema``)."""
    import inspect

    import trl
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    version = f"TRL {trl.__version__}"
    if "tools" not in inspect.signature(GRPOTrainer.__init__).parameters:
        return f"{version}'s GRPOTrainer takes no tools"
    from trl.chat_template_utils import add_response_schema

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    reasons = []
    try:
        add_response_schema(tokenizer)
    except ValueError:
        reasons.append("it cannot parse tool calls from this model's chat template")
    tool = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "hi"}]
    render = tokenizer.apply_chat_template
    if render(messages, tokenize=False) == render(messages, tools=[tool], tokenize=False):
        reasons.append("the template has no tools section, so TRL's tools never reach the model")
    if not reasons:
        return (
            f"{version}'s GRPOTrainer could run this model's tool calls (tools=), but compare "
            "does not drive TRL's tool loop yet"
        )
    return f"{version}'s GRPOTrainer runs tools only through the chat template: " + "; ".join(
        reasons
    )


class SingleTurnTasks:
    """The run's first train tasks in its own stream order, rendered as our template
    renders them, and scored by its environments on a single completion."""

    def __init__(self, cfg: RunConfig, n: int):
        from tunix_agentic.agent.chat import make_chat_template
        from tunix_agentic.agent.tool_parser import get_parser
        from tunix_agentic.data.sources import RunSources
        from tunix_agentic.models.tokenizers import load_tokenizer

        self.cfg = cfg
        self.sources = RunSources(
            cfg.tasks,
            tool_timeout=cfg.env.tool_timeout_s,
            sandbox=cfg.env.sandbox,
            env_name=cfg.env.name,
            env_kwargs=cfg.env.kwargs,
        )
        stream = self.sources.train_stream(cfg.seed)
        self.tasks = [next(stream) for _ in range(n)]
        self.tokenizer = load_tokenizer(cfg.model.source, cfg.model.path, cfg.model.vocab_size)
        self.template = make_chat_template(self.tokenizer, **cfg.agent.template_options())
        self.parse = get_parser(cfg.agent.parser)

    async def _prompt(self, task: Any) -> list[int]:
        env = self.sources.make_env(task)
        try:
            prompt = await env.reset(task)
            return self.template.prompt_ids(prompt, tools=env.tool_schemas())
        finally:
            await env.close()

    def prompts(self, tasks: list[Any] | None = None) -> list[list[int]]:
        """Each task's prompt ids (the train tasks' by default), as our rollout renders
        them."""

        async def all_prompts():
            return [await self._prompt(t) for t in (self.tasks if tasks is None else tasks)]

        return asyncio.run(all_prompts())

    async def score(self, index: int, completion: str) -> float:
        """Our environment's reward for ``completion`` as the only turn of task ``index``
        (0.0 when the environment fails on it, as our EVAL stage scores an env error)."""
        return await self.score_task(self.tasks[index], completion, index)

    async def score_task(self, task: Any, completion: str, index: int = 0) -> float:
        """Our environment's reward for ``completion`` as the only turn of ``task``."""
        from tunix_agentic.trajectory import Step, Trajectory, task_key

        env = self.sources.make_env(task)
        try:
            prompt = await env.reset(task)
            ids = self.template.prompt_ids(prompt, tools=env.tool_schemas())
            traj = Trajectory(task_id=task_key(task).id, episode_id=str(index))
            traj.append_prompt(ids)
            action_ids = self.tokenizer.encode(completion)
            traj.append_action(
                Step(len(ids), action_ids, [0.0] * len(action_ids), [0] * len(action_ids), "stop")
            )
            traj.steps[-1].action_text = completion
            result = await env.step(self.parse(completion))
            traj.steps[-1].reward, traj.steps[-1].done = float(result.reward), result.done
            return float(await env.evaluate_trajectory(traj))
        except Exception:
            return 0.0
        finally:
            await env.close()


class HeldOutEval:
    """Success (reward > 0, as our evaluation counts it) of a TRL policy on ``n`` held-out
    tasks of each source, the tasks our evaluation draws for this seed: one completion
    each from ``transformers``' ``generate`` (greedy at ``rl.eval_temperature`` 0, else
    sampled at it), up to ``agent.max_new_tokens``, stopped at the tokenizer's EOS,
    decoded without special tokens (as TRL decodes for its reward functions), scored
    by our environment."""

    def __init__(self, tasks: SingleTurnTasks, n: int):
        self.tasks = tasks
        held = tasks.sources.heldout(n, seed=tasks.cfg.seed)
        self.heldout = [t for ts in held.values() for t in ts]
        self.prompt_ids = tasks.prompts(self.heldout)
        self.seconds = 0.0

    def __call__(self, model, tokenizer) -> float:
        import torch

        t0 = time.perf_counter()
        cfg = self.tasks.cfg
        width = max(len(ids) for ids in self.prompt_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in self.prompt_ids])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in self.prompt_ids])
        temperature = cfg.rl.eval_temperature
        sampling = (
            {"do_sample": False}
            if temperature == 0
            else {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        )
        with inference_mode(model):
            out = model.generate(
                input_ids=ids,
                attention_mask=attention,
                max_new_tokens=cfg.agent.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=pad,
                **sampling,
            )
        texts = []
        for row in out[:, width:].tolist():
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            texts.append(tokenizer.decode(row, skip_special_tokens=True))

        async def all_scores():
            return await asyncio.gather(
                *(self.tasks.score_task(t, c) for t, c in zip(self.heldout, texts, strict=True))
            )

        rewards = asyncio.run(all_scores())
        self.seconds += time.perf_counter() - t0
        return float(np.mean([r > 0 for r in rewards]))


class SingleTurnReward:
    """A TRL reward function: our environment's reward of each completion."""

    __name__ = "env_reward"

    def __init__(self, tasks: SingleTurnTasks):
        self.tasks = tasks
        self.seconds = 0.0

    def __call__(self, prompts, completions, task_index, **_) -> list[float]:
        t0 = time.perf_counter()

        async def all_scores():
            return await asyncio.gather(
                *(self.tasks.score(int(i), c) for i, c in zip(task_index, completions, strict=True))
            )

        out = asyncio.run(all_scores())
        self.seconds += time.perf_counter() - t0
        return [float(r) for r in out]


def build_trainer(
    hf_dir: str | Path,
    mapping: dict[str, Any],
    *,
    out_dir: str | Path,
    dataset_rows: list[dict[str, Any]] | None = None,
    reward=None,
    lora: dict[str, Any] | None = None,
):
    """A ``trl.GRPOTrainer`` on ``hf_dir`` (float32, CPU) configured with ``mapping``
    (:meth:`TRLMapping.kwargs`). Without ``dataset_rows`` it gets a one-row placeholder
    dataset and a zero reward (enough to call its loss)."""
    require_trl()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    torch.manual_seed(int(mapping.get("seed", 0)))
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **mapping,
    )
    if dataset_rows is None:
        dataset_rows = [{"prompt": "x", "task_index": 0}]
    if reward is None:

        def reward(completions, **_):
            return [0.0] * len(completions)

    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **lora)
    return _timed_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(dataset_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def _timed_trainer_class():
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that adds up the seconds spent generating."""

        generation_s = 0.0

        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                self.generation_s += time.perf_counter() - t0

    return TimedGRPOTrainer


def trl_loss(trainer, batch: ParityBatch) -> float:
    """TRL's own loss (``GRPOTrainer._compute_loss``) of ``batch`` on the trainer's
    current weights, in eval mode (no dropout, no gradient-accumulation scaling).

    The batch is split at the first trained position of any row: what precedes it is
    the prompt, the rest the completion, with our loss mask as TRL's ``tool_mask``, so no
    row is left-padded and positions are those our model saw.
    """
    import torch

    parts = split_for_trl(batch)
    inputs = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in parts.items()}
    inputs["num_items_in_batch"] = inputs["tool_mask"].sum()
    with inference_mode(trainer.model):
        loss = trainer._compute_loss(trainer.model, inputs)
    return float(loss)


def sampler_gap(trainer, batch: ParityBatch) -> dict[str, float]:
    """How far the logprobs our engine sampled the batch's trained tokens with are from
    TRL's own per-token logprobs of the same tokens (``_get_per_token_logps_and_entropies``,
    at TRL's temperature) on the trainer's current weights: both sides sample from the
    same distribution when the gap is float noise. ``max``/``mean`` over trained tokens."""
    import torch

    parts = split_for_trl(batch)
    ids = np.concatenate([parts["prompt_ids"], parts["completion_ids"]], axis=1)
    keep = parts["completion_ids"].shape[1]
    with inference_mode(trainer.model):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.int64), keep
        )
    trained = parts["tool_mask"] > 0
    gap = np.abs(logps.float().numpy() - parts["old_per_token_logps"])[trained]
    return {"max": float(gap.max()), "mean": float(gap.mean()), "tokens": int(gap.size)}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """What the subprocess does: TRL's loss on our first batch, then ``steps`` steps."""
    from transformers import TrainerCallback

    t_start = time.perf_counter()
    cfg = load_config(job["config"], job["overrides"])
    mapping = job["mapping"]
    steps = int(mapping["max_steps"])
    per_step = int(mapping["per_device_train_batch_size"]) // int(mapping["num_generations"])
    tasks = SingleTurnTasks(cfg, steps * per_step)
    prompt_ids = tasks.prompts()
    rows = [
        {"prompt": tasks.tokenizer.decode(ids), "task_index": i} for i, ids in enumerate(prompt_ids)
    ]
    reward = SingleTurnReward(tasks)
    trainer = build_trainer(
        job["hf_dir"],
        mapping,
        out_dir=job["out_dir"],
        dataset_rows=rows,
        reward=reward,
        lora=job.get("lora"),
    )
    same_ids = [
        list(trainer.processing_class(text=r["prompt"])["input_ids"]) == list(ids)
        for r, ids in zip(rows, prompt_ids, strict=True)
    ]
    result: dict[str, Any] = {"prompt_ids_identical": all(same_ids)}
    if cfg.agent.max_turns > 1:
        result["single_turn_why"] = single_turn_why(job["hf_dir"])
    batches = {name: ParityBatch.load(path) for name, path in job["batches"].items()}
    result["parity_losses"] = {name: trl_loss(trainer, b) for name, b in batches.items()}
    # The first batch ours trained on was sampled by our engine from the initial weights:
    # its logprobs against TRL's of the same tokens, before TRL trains.
    result["sampler_logprob_gap"] = sampler_gap(trainer, batches["as_trained"])
    # shuffle_dataset=False (the mapping): TRL takes the prompts in our stream's order.
    per_step_s: list[float] = []
    gen_s: list[float] = []
    reward_s: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.marks = (trainer.generation_s, reward.seconds)

        def on_step_end(self, args, state, control, **kw):
            per_step_s.append(time.perf_counter() - self.t0)
            gen_s.append(trainer.generation_s - self.marks[0])
            reward_s.append(reward.seconds - self.marks[1])

    trainer.add_callback(Timer())
    heldout: dict[int, float] = {}
    n_heldout = int(job.get("heldout", 0))
    if n_heldout:
        evaluate = HeldOutEval(tasks, n_heldout)
        heldout[0] = evaluate(trainer.model, trainer.processing_class)

        class Evaluate(TrainerCallback):
            # Added after Timer: its seconds fall outside the step's.
            def on_step_end(self, args, state, control, **kw):
                heldout[state.global_step] = evaluate(trainer.model, trainer.processing_class)

        trainer.add_callback(Evaluate())
    t_train = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - t_train
    logs = [h for h in trainer.state.log_history if "reward" in h]
    rows_per_step = int(mapping["per_device_train_batch_size"])
    steps_out = []
    for i, h in enumerate(logs):
        step_s = per_step_s[i] if i < len(per_step_s) else float("nan")
        tokens = float(h.get("completions/mean_length", 0.0)) * rows_per_step
        steps_out.append(
            {
                "step": i + 1,
                "reward_mean": float(h["reward"]),
                "step_s": step_s,
                "generation_s": gen_s[i] if i < len(gen_s) else float("nan"),
                "reward_s": reward_s[i] if i < len(reward_s) else float("nan"),
                # Scoring (old/ref logprobs) and the update; TRL has no separate engine.
                "train_s": step_s - gen_s[i] - reward_s[i] if i < len(gen_s) else float("nan"),
                "weight_sync_s": 0.0,
                "generated_tokens": tokens,
                "tokens_per_s": tokens / step_s if step_s > 0 else float("nan"),
                "loss": float(h.get("loss", float("nan"))),
            }
        )
    result.update(
        {
            "steps": steps_out,
            "heldout_success": heldout,
            "train_wall_s": train_wall,
            "wall_s": time.perf_counter() - t_start,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch_threads(),
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    return job_main(run_job, argv)


if __name__ == "__main__":
    sys.exit(main())
