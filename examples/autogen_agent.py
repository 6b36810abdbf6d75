"""The calculator agent of ``openai_agent.py`` written with AutoGen (AgentChat), trained the
same way through a rollout node.

``autogen_calculator_agent`` is AutoGen's own loop: an ``AssistantAgent`` with the
calculator as a tool function, on an ``OpenAIChatCompletionClient`` pointed at the node
with the claim's headers, run by ``AssistantAgent.run``. Two settings are needed:

- ``system_message=None``: AutoGen's default system message ("You are a helpful AI
  assistant. ... Reply with TERMINATE ...", 116 characters) fills the default run's whole
  128-token window with the task (the node answers a 400), and the policy never saw it.
- ``model_info``: AutoGen knows OpenAI's model names only, and asks what "policy" can do
  (function calling; no vision, no JSON or structured output).

``max_tool_iterations`` is the claim's ``max_turns`` and ``reflect_on_tool_use`` is off,
so an episode is at most ``max_turns`` model calls (AutoGen re-sends the whole history
each call). Claiming, scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/autogen_agent.py --url http://127.0.0.1:8200

Needs ``autogen-agentchat`` and ``autogen-ext[openai]``, installed without their pins
(``autogen-core`` pins ``protobuf~=5.29``, which tensorboard's ``>=6.31`` rules out; it runs
on protobuf 7): ``pip install --no-deps autogen-core autogen-agentchat autogen-ext jsonref``,
as ``.ci/run`` does. Takes the same flags as ``openai_agent.py``.
"""

from __future__ import annotations

import asyncio

import openai
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient
from openai_agent import calculate, close_episode, episode_headers, main, parse_args, score

MODEL_INFO = {  # what AutoGen cannot know about "policy"
    "family": "unknown",
    "function_calling": True,
    "vision": False,
    "json_output": False,
    "structured_output": False,
}


async def autogen_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by AutoGen: ``(reward, tool calls made)``."""
    calls = 0

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses."""
        nonlocal calls
        calls += 1
        return await calculate({"expression": expression})

    model = OpenAIChatCompletionClient(
        model="policy",
        base_url=str(client.base_url),
        api_key=client.api_key,
        default_headers=episode_headers(claim),  # the claim's token: these calls are its
        max_retries=0,
        model_info=MODEL_INFO,
    )
    agent = AssistantAgent(
        "calculator",
        model_client=model,
        tools=[calculator],
        system_message=None,
        max_tool_iterations=claim["max_turns"],
        reflect_on_tool_use=False,
    )
    try:
        result = await agent.run(task=claim["prompt"])
    finally:
        await model.close()
    last = result.messages[-1]
    reward = score(claim, last.content if isinstance(last, TextMessage) else None)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), autogen_calculator_agent))
