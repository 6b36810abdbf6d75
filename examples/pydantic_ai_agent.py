"""The calculator agent of ``openai_agent.py`` written with pydantic-ai, trained the same
way through a rollout node.

``pydantic_ai_calculator_agent`` is pydantic-ai's own loop: an ``Agent`` with the
calculator as a tool function, on an ``OpenAIChatModel`` whose ``OpenAIProvider`` is an
``AsyncOpenAI`` pointed at the node with the claim's headers, run by ``Agent.run`` for at
most the claim's ``max_turns`` model requests (``UsageLimits``). pydantic-ai sends no
system prompt unless given one, re-sends the whole history each turn, and answers a tool
call whose arguments fail validation with a retry prompt (one retry per tool, then
``UnexpectedModelBehavior``). Claiming, scoring and closing the episode are
``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/pydantic_ai_agent.py --url http://127.0.0.1:8200

Needs ``pydantic-ai-slim[openai]`` (in the ``dev`` extra). Takes the same flags as
``openai_agent.py``.
"""

from __future__ import annotations

import asyncio

import openai
from openai_agent import calculate, close_episode, episode_headers, main, parse_args, score
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


async def pydantic_ai_calculator_agent(
    client: openai.AsyncOpenAI, claim: dict
) -> tuple[float, int]:
    """One claimed episode by pydantic-ai: ``(reward, tool calls made)``."""
    calls = 0

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: The arithmetic expression to evaluate.
        """
        nonlocal calls
        calls += 1
        return await calculate({"expression": expression})

    own = openai.AsyncOpenAI(  # the claim's token: this episode's calls are this agent's
        base_url=str(client.base_url),
        api_key=client.api_key,
        default_headers=episode_headers(claim),
        max_retries=0,
    )
    model = OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=own))
    agent = Agent(model, tools=[calculator])
    limits = UsageLimits(request_limit=claim["max_turns"])
    try:
        result = await agent.run(claim["prompt"], usage_limits=limits)
        text = result.output
    except (UsageLimitExceeded, UnexpectedModelBehavior, ModelHTTPError):
        # Out of requests, a reply pydantic-ai gave up on, or a call the node refused (the
        # conversation outgrew the window): no answer. A withdrawn claim's close is refused
        # too, with the ``openai`` error the worker expects.
        text = None
    finally:
        await own.close()
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), pydantic_ai_calculator_agent))
