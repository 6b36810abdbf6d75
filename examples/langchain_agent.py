"""The calculator agent of ``openai_agent.py`` written with LangChain instead, trained the
same way through a rollout node.

``langchain_calculator_agent`` is LangChain's own tool-calling loop: ``ChatOpenAI`` pointed
at the node, ``bind_tools`` with the calculator's schema, ``AIMessage.tool_calls`` run and
answered with ``ToolMessage``\\ s. LangChain re-sends the whole history each turn (with
``content: null`` and its own tool-call ids), which the node stitches into one learner row
per episode. Claiming, scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/langchain_agent.py --url http://127.0.0.1:8200

Needs ``langchain-openai`` (in the ``dev`` extra). Takes the same flags as
``openai_agent.py`` (``--own-tasks``, ``--concurrency``, ``--max-episodes``).
"""

from __future__ import annotations

import asyncio

import openai
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from openai_agent import TOOLS, calculate, close_episode, episode_headers, main, parse_args, score


async def langchain_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by LangChain: ``(reward, tool calls made)``."""
    headers = episode_headers(claim)
    llm = ChatOpenAI(
        model="policy",
        base_url=str(client.base_url),
        api_key=client.api_key,
        default_headers=headers,  # the claim's token: this episode's calls are this agent's
        max_retries=0,
    ).bind_tools(TOOLS)
    messages: list = [HumanMessage(claim["prompt"])]
    calls = 0
    reply = None
    for _ in range(claim["max_turns"]):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            calls += 1
            result = await calculate(call["args"])
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    text = reply.content if reply is not None and isinstance(reply.content, str) else None
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), langchain_calculator_agent))
