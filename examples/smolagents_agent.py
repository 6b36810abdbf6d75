"""The calculator agent of ``openai_agent.py`` written with smolagents, trained the same way
through a rollout node.

``smolagents_calculator_agent`` is smolagents' own loop: a ``ToolCallingAgent`` with the
calculator as a ``@tool``, on ``OpenAIServerModel`` pointed at the node with the claim's
headers, run for at most the claim's ``max_turns`` steps (out of steps, smolagents makes
one more call, without tools, for a final answer). The agent answers by calling its
``final_answer`` tool, whose argument is scored. smolagents forces a tool call every
step (``tool_choice: "required"``: the node's grammar holds the policy to a call) and
re-sends its transcript as text (tool calls as "Calling tools: ...", results as
"Observation: ..."), so each call is a learner row of its own. Settings needed:

- the prompt templates: smolagents' system prompt (3,800 characters of examples for
  large models) and its final-answer prompts are longer than the default run's whole
  128-token window; the example sends a short system prompt and final-answer prompts.
- ``asyncio.to_thread``: smolagents is synchronous (the ``openai`` client's blocking
  calls), so the run goes to a thread and the event loop keeps serving.
- ``verbosity_level``: off, or every episode prints its steps.

Claiming, scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200
    tunix-agentic train --config configs/calculator_tiny.yaml \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=external
    python examples/smolagents_agent.py --url http://127.0.0.1:8200

Needs ``smolagents[openai]`` (in the ``dev`` extra). Takes the same flags as
``openai_agent.py``.
"""

from __future__ import annotations

import asyncio

import openai
from openai_agent import calculate, close_episode, episode_headers, main, parse_args, score
from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool
from smolagents.utils import AgentError

SYSTEM_PROMPT = "Use the calculator, then call final_answer."
FINAL_ANSWER = {"pre_messages": "Answer the task.", "post_messages": "{{task}}"}


async def smolagents_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by smolagents: ``(reward, tool calls made)``."""
    calls = 0
    loop = asyncio.get_running_loop()

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: The arithmetic expression to evaluate.
        """
        nonlocal calls
        calls += 1
        return asyncio.run_coroutine_threadsafe(
            calculate({"expression": expression}), loop
        ).result()

    model = OpenAIServerModel(
        "policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"default_headers": episode_headers(claim), "max_retries": 0},
    )
    agent = ToolCallingAgent(
        tools=[calculator], model=model, max_steps=claim["max_turns"], verbosity_level=LogLevel.OFF
    )
    agent.prompt_templates["system_prompt"] = SYSTEM_PROMPT
    agent.prompt_templates["final_answer"] = FINAL_ANSWER
    try:
        result = await asyncio.to_thread(agent.run, claim["prompt"], return_full_result=True)
        # final_answer's argument; out of steps, the reply to smolagents' final-answer prompt.
        success = result.state == "success"
        text = f"<answer>{result.output}</answer>" if success else str(result.output)
    except AgentError:
        # A call the node refused (the transcript outgrew the window): no answer. A withdrawn
        # claim's close is refused too, with the ``openai`` error the worker expects.
        text = None
    finally:
        model.client.close()
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), smolagents_calculator_agent))
