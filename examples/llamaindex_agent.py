"""The calculator agent of ``openai_agent.py`` written with LlamaIndex, trained the same way
through a rollout node.

``llamaindex_calculator_agent`` is LlamaIndex's own loop: a ``FunctionAgent`` (its
function-calling agent workflow, streamed) with the calculator as a ``FunctionTool``, on
``OpenAILike`` pointed at the node with the claim's headers, run for at most the claim's
``max_turns`` model calls (``max_iterations``). Settings needed:

- ``temperature``: ``OpenAILike`` sends 0.1 unless told, which the node would apply
  instead of the group's sampling (the learner trains on what was sampled at 1.0); the
  claim's own value is passed (1.0 for the agent's own tasks).
- ``is_chat_model`` and ``is_function_calling_model``: LlamaIndex knows OpenAI's model
  names only; "policy" is a chat model that calls functions.
- no ``ReActAgent``: its system prompt (the ReAct format) is longer than the default
  run's whole 128-token window. ``FunctionAgent`` sends none unless given one.

Claiming, scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/llamaindex_agent.py --url http://127.0.0.1:8200

Needs ``llama-index-core`` (in the ``dev`` extra) and ``llama-index-llms-openai-like``,
installed without its pins (it pins ``openai<3``, which ``openai-agents`` rules out; it runs
on openai 3): ``pip install --no-deps llama-index-llms-openai llama-index-llms-openai-like``,
as ``.ci/run`` does. Takes the same flags as ``openai_agent.py``.
"""

from __future__ import annotations

import asyncio

import openai
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import WorkflowRuntimeError
from llama_index.llms.openai_like import OpenAILike
from openai_agent import calculate, close_episode, episode_headers, main, parse_args, score


async def llamaindex_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by LlamaIndex: ``(reward, tool calls made)``."""
    calls = 0

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses."""
        nonlocal calls
        calls += 1
        return await calculate({"expression": expression})

    llm = OpenAILike(
        model="policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        default_headers=episode_headers(claim),  # the claim's token: these calls are its
        temperature=claim.get("sampling", {}).get("temperature", 1.0),  # own tasks: 1.0
        is_chat_model=True,
        is_function_calling_model=True,
        max_retries=0,
    )
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(async_fn=calculator)], llm=llm)
    try:
        reply = await agent.run(claim["prompt"], max_iterations=claim["max_turns"])
        text = str(reply)
    except WorkflowRuntimeError:
        text = None  # out of iterations: no answer
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), llamaindex_calculator_agent))
