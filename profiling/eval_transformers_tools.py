"""Held-out success of a tool-using run, checked outside our engine: transformers' ``generate``
plays the episodes, with the environment's tools and checker in a small loop.

Give a trained run (``--run RUN_DIR``: its newest checkpoint is exported with
:func:`tunix_agentic.export.export_run` into a temporary directory and its
``config.yaml`` is the recipe) or a Hugging Face model directory and a recipe
(``--model DIR --config RECIPE``, e.g. the converted SmolLM2 before any training).
Each held-out episode: the conversation (system turn with the tools as the run showed
them, the task's prompt) is rendered by the tokenizer's own chat template
(``apply_chat_template``), greedy ``generate`` writes one turn, our parser reads it
(``agent.parser``), the environment steps (its tools run, its checker scores), and the
tool messages join the conversation, until the environment says done or
``agent.max_turns``. Episodes play in one left-padded batch per turn. ``--engine both``
also evaluates the same model with our engine (the trainer's evaluation) and prints the
difference; nothing is asserted.

    python -m profiling.eval_transformers_tools --run runs/smollm2_capitals_tools --engine both
    python -m profiling.eval_transformers_tools --model models/smollm2-135m \\
        --config configs/smollm2_capitals_tools_cpu.yaml --tasks 20
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tunix_agentic.agent.chat import tools_prompt_text
from tunix_agentic.agent.loop import cap_tool_calls
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.config import RunConfig, load_config
from tunix_agentic.data.run_inputs import run_task_sources

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "smollm2_capitals_tools_cpu.yaml"


@dataclasses.dataclass
class Episode:
    """One held-out episode played by transformers: its conversation so far and outcome."""

    task: Any
    env: Any
    messages: list[dict[str, Any]]
    turns: int = 0
    tokens: int = 0
    used_tool: bool = False
    status: str = "running"
    reward: float = 0.0


@dataclasses.dataclass(frozen=True)
class Figures:
    """Held-out figures of one evaluation (the trainer's names and meanings)."""

    engine: str
    episodes: int
    success: float
    tool_use: float
    reward: float
    turns: float
    generated_tokens: float
    statuses: dict[str, int]
    seconds: float


def first_messages(cfg: RunConfig, tokenizer: Any, prompt: str, tools: list[dict]) -> list:
    """The opening conversation as the run showed it: the tools in the system turn when the
    template drops them (``agent.tools_fallback`` system), else left to the template."""
    user = {"role": "user", "content": prompt}
    if not tools or cfg.agent.tools_fallback == "drop" or renders_tools(tokenizer, tools):
        return [user]
    system = tools_prompt_text(tools, cfg.agent.tools_prompt or None)
    return [{"role": "system", "content": system}, user]


def renders_tools(tokenizer: Any, tools: list[dict]) -> bool:
    """Whether the tokenizer's chat template lists ``tools`` itself."""
    probe = [{"role": "user", "content": "x"}]
    bare = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    with_tools = tokenizer.apply_chat_template(
        probe, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return bare != with_tools


def generate_turns(model: Any, tokenizer: Any, texts: list[str], max_new_tokens: int) -> list:
    """Greedy turns for ``texts`` in one left-padded batch: ``(text, n_tokens, stopped)``
    each, the text up to (without) the end-of-turn token."""
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=[stop, tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
        )
    turns = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        ends = [i for i, t in enumerate(row) if t in (stop, tokenizer.eos_token_id)]
        n = ends[0] + 1 if ends else len(row)
        turns.append((tokenizer.decode(row[: n - 1 if ends else n]), n, bool(ends)))
    return turns


async def play(cfg: RunConfig, model: Any, tokenizer: Any, tasks: list, sources: Any) -> list:
    """The held-out ``tasks`` played turn by turn with ``generate`` (see the module)."""
    parse = get_parser(cfg.agent.parser)
    episodes = []
    for task in tasks:
        env = sources.make_env(task)
        prompt = await env.reset(task)
        messages = first_messages(cfg, tokenizer, prompt, env.tool_schemas())
        episodes.append(Episode(task, env, messages))
    for _ in range(cfg.agent.max_turns):
        live = [e for e in episodes if e.status == "running"]
        if not live:
            break
        texts = [
            tokenizer.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True)
            for e in live
        ]
        for episode, (text, n, stopped) in zip(
            live, generate_turns(model, tokenizer, texts, cfg.agent.max_new_tokens), strict=True
        ):
            episode.turns += 1
            episode.tokens += n
            if not stopped:  # the turn never ended: as our loop, nothing to act on
                episode.status = "max_tokens"
                continue
            action = cap_tool_calls(parse(text), cfg.agent.max_tool_calls_per_turn)
            episode.used_tool |= bool(action.tool_calls)
            result = await episode.env.step(action)
            if result.done:
                episode.status = "ok"
                continue
            episode.messages.append({"role": "assistant", "content": text})
            episode.messages += result.messages or [{"role": "user", "content": result.observation}]
    for episode in episodes:
        if episode.status == "running":
            episode.status = "max_turns"
        episode.reward = float(await episode.env.evaluate())
        await episode.env.close()
    return episodes


def figures(engine: str, episodes: list[Episode], seconds: float) -> Figures:
    n = len(episodes)
    statuses: dict[str, int] = {}
    for e in episodes:
        statuses[e.status] = statuses.get(e.status, 0) + 1
    return Figures(
        engine=engine,
        episodes=n,
        success=sum(e.reward > 0 for e in episodes) / n,
        tool_use=sum(e.used_tool for e in episodes) / n,
        reward=sum(e.reward for e in episodes) / n,
        turns=sum(e.turns for e in episodes) / n,
        generated_tokens=sum(e.tokens for e in episodes) / n,
        statuses=statuses,
        seconds=seconds,
    )


def eval_transformers(cfg: RunConfig, model_dir: str, n: int) -> Figures:
    """``n`` held-out tasks of every task source, played by transformers."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    sources = run_task_sources(cfg)
    tasks = [t for ts in sources.heldout(n, seed=cfg.seed).values() for t in ts]
    t0 = time.perf_counter()
    episodes = asyncio.run(play(cfg, model, tokenizer, tasks, sources))
    return figures("transformers", episodes, time.perf_counter() - t0)


def eval_ours(cfg: RunConfig, n: int) -> Figures:
    """The same held-out tasks on our engine, as the trainer evaluates (greedy unless the
    run set ``rl.eval_temperature``)."""
    from tunix_agentic.cli.eval_cmd import evaluate_held_out
    from tunix_agentic.models.hf import build_model
    from tunix_agentic.trainer import Trainer

    # A one-off check, not a timing: on a busy machine the first turns wait for the compile
    # longer than a training episode's deadline allows.
    rollout = dataclasses.replace(
        cfg.rollout, episode_timeout_s=max(cfg.rollout.episode_timeout_s, 3600.0)
    )
    trainer = Trainer(dataclasses.replace(cfg, rollout=rollout), resume=True, progress=False)
    cfg = trainer.cfg  # reads the run, writes nothing
    model = build_model(cfg.model)

    t0 = time.perf_counter()
    ev = asyncio.run(evaluate_held_out(trainer, model, 0, n))
    return Figures(
        engine="ours",
        episodes=ev.episodes,
        success=ev.success,
        tool_use=ev.tool_use,
        reward=ev.reward,
        turns=ev.turns,
        generated_tokens=ev.generated_tokens,
        statuses=dict(ev.statuses),
        seconds=time.perf_counter() - t0,
    )


def main(argv: list[str] | None = None) -> list[Figures]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--run", help="a trained run dir (its newest checkpoint is exported)")
    where.add_argument("--model", help="a Hugging Face model dir (with --config)")
    parser.add_argument("--config", default=str(RECIPE), help="the recipe (with --model)")
    parser.add_argument("--tasks", type=int, default=None, help="held-out tasks (rl.eval_tasks)")
    parser.add_argument("--engine", choices=("transformers", "ours", "both"), default="both")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eval-tools-") as tmp:
        if args.run:
            from tunix_agentic.export import export_run

            model_dir = str(Path(tmp) / "export")
            done = export_run(args.run, model_dir)
            print(f"exported step {done['step']} of {args.run}", file=sys.stderr)
            config = str(Path(args.run) / "config.yaml")
        else:
            model_dir, config = args.model, args.config
        run_dir = str(Path(tmp) / "run")  # never written: the evaluation reads, saves nothing
        cfg = load_config(
            config, [*args.overrides, f"model.path={model_dir}", f"run_dir={run_dir}"]
        )
        n = args.tasks or cfg.rl.eval_tasks
        results = []
        if args.engine in ("ours", "both"):
            results.append(eval_ours(cfg, n))
            print(json.dumps(dataclasses.asdict(results[-1])), flush=True)
        if args.engine in ("transformers", "both"):
            results.append(eval_transformers(cfg, model_dir, n))
            print(json.dumps(dataclasses.asdict(results[-1])), flush=True)
    if len(results) == 2:
        ours, theirs = results
        print(
            f"held-out success: ours {ours.success:.3f}, transformers {theirs.success:.3f} "
            f"(difference {theirs.success - ours.success:+.3f}); tool use {ours.tool_use:.3f} "
            f"vs {theirs.tool_use:.3f}; {n} tasks"
        )
    return results


if __name__ == "__main__":
    main()
