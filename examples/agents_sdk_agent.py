"""The calculator agent of ``openai_agent.py`` written with the OpenAI Agents SDK, trained
the same way through a rollout node.

``agents_sdk_calculator_agent`` is the SDK's own loop: an ``Agent`` with the calculator as
a ``function_tool``, on the SDK's default model class (``OpenAIResponsesModel``: the
node's ``/v1/responses``) pointed at the node, run by ``Runner.run`` for at most the
claim's ``max_turns`` model calls (tracing off: nothing leaves the machine). Claiming,
scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/agents_sdk_agent.py --url http://127.0.0.1:8200

Needs ``openai-agents`` (in the ``dev`` extra). Takes the same flags as
``openai_agent.py``.
"""

from __future__ import annotations

import asyncio
import json

import agents
import openai
from openai_agent import calculate, close_episode, episode_headers, main, parse_args, score


async def agents_sdk_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by the Agents SDK: ``(reward, tool calls made)``."""
    calls = 0

    @agents.function_tool
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        nonlocal calls
        calls += 1
        return await calculate({"expression": expression})

    headers = episode_headers(claim)
    own = openai.AsyncOpenAI(  # the claim's token: this episode's calls are this agent's
        base_url=str(client.base_url),
        api_key=client.api_key,
        default_headers=headers,
        max_retries=0,
    )
    agent = agents.Agent(
        name="calculator",
        model=agents.OpenAIResponsesModel(model="policy", openai_client=own),
        tools=[calculator],
    )
    run = agents.RunConfig(tracing_disabled=True)
    try:
        result = await agents.Runner.run(
            agent, claim["prompt"], run_config=run, max_turns=claim["max_turns"]
        )
        text = (
            result.final_output
            if isinstance(result.final_output, str)
            else json.dumps(result.final_output)
        )
    except (agents.MaxTurnsExceeded, agents.ModelBehaviorError):
        text = None  # out of turns, or a reply cut at max_tokens (incomplete): no answer
    finally:
        await own.close()
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), agents_sdk_calculator_agent))
