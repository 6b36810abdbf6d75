"""A tool-calling agent written against the official ``openai`` client, trained through a
rollout node.

``calculator_agent`` (30 lines) knows the node only as an OpenAI-compatible URL: it sends
the task's prompt with the calculator tool, runs the tool calls the model makes, scores
the final ``<answer>`` and closes the episode with its reward. The loop around it claims
the members of the node's ``"agent": "external"`` groups (a trainer run with
``rollout.service.agent=external``) and runs ``--concurrency`` of them at a time::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/openai_agent.py --url http://127.0.0.1:8200

Sampling (temperature, max tokens, seed) is the group's: the node applies it to the calls
of a claimed episode, which therefore pass none.

With ``--own-tasks GROUP_SIZE`` the agent runs calculator tasks of its own instead (a
trainer run with ``rollout.service.agent=own_tasks``): each task ``GROUP_SIZE`` times,
every episode under its own ``X-Episode-Id`` and token, closed with its reward and the
task's id; the node makes each task's episodes one group. ``--task-seed`` picks the tasks. Prints one line per episode
(``episode ID reward R tool_calls K``) and runs until killed, or until it has claimed ``--max-episodes``
(episodes claimed meanwhile by other workers still run).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import secrets
import sys

import openai

from tunix_agentic.envs.calculator import (
    ArithmeticEnv,
    CalculatorTool,
    answers_match,
    make_arithmetic_task,
)

TOOLS = ArithmeticEnv().tool_schemas()  # OpenAI function schemas


async def calculate(arguments: str | dict) -> str:
    """The calculator's reply to one call (its arguments as JSON text or a dict), or the
    call's error as the tool message says it."""
    try:
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        return await CalculatorTool().run(**arguments)
    except (TypeError, ValueError) as exc:
        return f"error: {exc}"


def episode_headers(claim: dict) -> dict[str, str]:
    """The headers that make a chat call or a reward the claimed episode's."""
    return {"X-Episode-Id": claim["episode_id"], "X-Episode-Token": claim["episode_token"]}


async def calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode: ``(reward, tool calls made)``."""
    messages = [{"role": "user", "content": claim["prompt"]}]
    # The claim's token makes the episode this agent's alone (its calls and its reward).
    headers = episode_headers(claim)
    calls = 0
    for _ in range(claim["max_turns"]):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, extra_headers=headers
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            calls += 1
            result = await calculate(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    reward = score(claim, message.content)
    await close_episode(client, claim, reward)
    return reward, calls


def own_episode(task, member: int, max_turns: int) -> dict:
    """What ``calculator_agent`` needs for an episode of a task the agent chose itself: an
    id and an unguessable token of its own (the node records the episode under both)."""
    return {
        "episode_id": f"own-{task.task_id}-{member}-{secrets.token_hex(4)}",
        "episode_token": secrets.token_urlsafe(24),
        "prompt": task.prompt,
        "max_turns": max_turns,
        "task": {"fields": {"answer": task.answer}},
        "own_task_id": task.task_id,
    }


async def own_task_worker(
    client: openai.AsyncOpenAI, next_task, group_size: int, budget: list[int | None], agent=None
) -> None:
    """Run tasks of the agent's own, each ``group_size`` times, until the budget is spent."""
    agent = agent or calculator_agent
    while budget[0] is None or budget[0] > 0:
        task = next_task()
        if budget[0] is not None:
            budget[0] -= group_size
        episodes = [own_episode(task, m, max_turns=3) for m in range(group_size)]
        ran = await asyncio.gather(*(agent(client, e) for e in episodes), return_exceptions=True)
        for episode, outcome in zip(episodes, ran, strict=True):
            if isinstance(outcome, BaseException):
                print(f"episode {episode['episode_id']} failed: {outcome}", file=sys.stderr)
                await asyncio.sleep(1.0)
                continue
            print(
                f"episode {episode['episode_id']} task {task.task_id} reward {outcome[0]:g} "
                f"tool_calls {outcome[1]}",
                flush=True,
            )


async def claim_episode(client: openai.AsyncOpenAI, wait_s: float) -> dict | None:
    """The next member offered by the node (``POST /v1/episodes/claim``), or None."""
    got = await client.post("/episodes/claim", body={"wait_s": wait_s}, cast_to=object)
    return got if isinstance(got, dict) else None  # 204: none offered


async def worker(client: openai.AsyncOpenAI, budget: list[int | None], agent=None) -> None:
    """Claim and run episodes until ``budget[0]`` (shared; None: no end) claims are made;
    ``agent(client, claim)`` runs one (default :func:`calculator_agent`)."""
    agent = agent or calculator_agent
    while budget[0] is None or budget[0] > 0:
        try:
            claim = await claim_episode(client, wait_s=10.0)
        except openai.APIError as exc:  # the node is away: try again
            print(f"claim failed: {exc}", file=sys.stderr, flush=True)
            await asyncio.sleep(1.0)
            continue
        if claim is None:
            continue
        if budget[0] is not None:
            budget[0] -= 1
        try:
            reward, calls = await agent(client, claim)
        except openai.APIError as exc:  # its lease runs out on the node
            print(f"episode {claim['episode_id']} failed: {exc}", file=sys.stderr, flush=True)
            continue
        print(
            f"episode {claim['episode_id']} group {claim['group_id']} reward {reward:g} "
            f"tool_calls {calls}",
            flush=True,
        )


async def close_episode(client: openai.AsyncOpenAI, claim: dict, reward: float) -> None:
    """Close the episode with its ``reward`` (and the agent's own task id, if any)."""
    headers = episode_headers(claim)
    body: dict = {"reward": reward}
    if "own_task_id" in claim:  # an episode of the agent's own task: the node groups by it
        body["task_id"] = claim["own_task_id"]
    await client.post(
        f"/episodes/{claim['episode_id']}/reward",
        body=body,
        cast_to=object,
        options={"headers": headers},
    )


def score(claim: dict, text: str | None) -> float:
    """1 when the reply's ``<answer>`` matches the task's answer, else 0."""
    answer = re.search(r"<answer>(.*?)</answer>", text or "")
    return float(
        answer is not None and answers_match(answer.group(1), claim["task"]["fields"]["answer"])
    )


async def main(args: argparse.Namespace, agent=None) -> None:
    """Run workers against ``args.url`` until the budget is spent (or forever); ``agent``
    runs one episode (default :func:`calculator_agent`)."""
    client = openai.AsyncOpenAI(
        base_url=f"{args.url.rstrip('/')}/v1", api_key=args.api_key, max_retries=0
    )
    budget: list[int | None] = [args.max_episodes if args.max_episodes > 0 else None]
    indices = itertools.count()

    def next_task():
        return make_arithmetic_task(next(indices), seed=args.task_seed, split="train")

    try:
        if args.own_tasks:
            workers = max(1, args.concurrency // args.own_tasks)
            await asyncio.gather(
                *(
                    own_task_worker(client, next_task, args.own_tasks, budget, agent)
                    for _ in range(workers)
                )
            )
        else:
            await asyncio.gather(*(worker(client, budget, agent) for _ in range(args.concurrency)))
    finally:
        await client.close()


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", required=True, help="the rollout node, http://HOST:PORT")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes run at once")
    parser.add_argument("--max-episodes", type=int, default=0, help="stop after N (0: never)")
    parser.add_argument("--api-key", default="unused", help="the node's key, if it has one")
    parser.add_argument(
        "--own-tasks",
        type=int,
        default=0,
        metavar="GROUP_SIZE",
        help="run tasks of the agent's own, each GROUP_SIZE times (rollout.service.agent="
        "own_tasks), instead of claiming the trainer's",
    )
    parser.add_argument("--task-seed", type=int, default=1234, help="which own tasks to draw")
    args = parser.parse_args()
    if args.own_tasks < 0:
        parser.error("--own-tasks must be >= 1 (or 0: claim the trainer's tasks)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0])))
