"""The calculator agent of ``openai_agent.py`` written with DSPy, trained the same way
through a rollout node.

``dspy_calculator_agent`` is DSPy's own loop: ``dspy.ReAct`` over the signature
``task -> answer`` with the calculator as a tool, on a ``dspy.LM`` pointed at the node
with the claim's headers, for at most the claim's ``max_turns`` iterations, run with
``acall`` (DSPy's async path: the event loop keeps serving). ReAct does not use the API's
tool calls: each iteration is one chat call whose reply names the next thought, tool and
arguments as text fields, and ReAct re-sends its whole trajectory as text, so each call
is a learner row of its own. A reply that does not parse is asked again through DSPy's
JSON adapter with ``response_format`` (the node's grammar holds the policy to JSON: forced
tokens, trained by default, ``learner.constrained_tokens``). At the end one more call
(``ChainOfThought``) extracts the answer. Settings needed:

- ``cache=False``: DSPy caches replies by prompt, so a second try of the same task would
  replay the first instead of sampling.
- ``num_retries=0``: a refused call (the episode withdrawn) is final.
- the window: ReAct's instructions and field markers are ~1,700 characters before the
  task, so with the built-in model (one token a character) the node needs
  ``engine.max_seq_len`` of 4096 or more; with a real tokenizer about 500 tokens.
- sampling: ``dspy.LM`` sends no temperature or token limit unless given one, so a claimed
  episode samples as its group does; an own task's calls stop at 200 tokens.
- errors: a reply that does not parse even as JSON raises DSPy's ``AdapterParseError``;
  the episode is closed unanswered (reward 0), as any other failed episode.

Claiming, scoring and closing the episode are ``openai_agent.py``'s::

    tunix-agentic serve-rollout --config configs/calculator_tiny.yaml --port 8200 \\
        engine.max_seq_len=4096
    tunix-agentic train --config configs/calculator_tiny.yaml engine.max_seq_len=4096 \\
        rollout.service.urls=[http://127.0.0.1:8200] rollout.service.agent=own_tasks
    python examples/dspy_agent.py --url http://127.0.0.1:8200 --own-tasks 2

Needs ``dspy`` (3.x). Takes the same flags as ``openai_agent.py``.
"""

from __future__ import annotations

import asyncio
import os

# LiteLLM (DSPy's client) fetches a model price list from GitHub at import unless told to
# use the copy it ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import openai  # noqa: E402
from dspy.utils.exceptions import DSPyError  # noqa: E402
from openai_agent import (  # noqa: E402
    calculate,
    close_episode,
    episode_headers,
    main,
    parse_args,
    score,
)

OWN_TASK_MAX_TOKENS = 200


class Solve(dspy.Signature):
    """Solve the arithmetic task; use the calculator."""

    task: str = dspy.InputField()
    answer: str = dspy.OutputField()


async def dspy_calculator_agent(client: openai.AsyncOpenAI, claim: dict) -> tuple[float, int]:
    """One claimed episode by DSPy's ReAct: ``(reward, tool calls made)``."""
    calls = 0

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses."""
        nonlocal calls
        calls += 1
        return await calculate({"expression": expression})

    lm = dspy.LM(
        "openai/policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        extra_headers=episode_headers(claim),  # the claim's token: this episode's calls
        cache=False,
        num_retries=0,
        # A claimed episode samples as its group (the node's defaults); an own task's
        # calls are bounded here, or each could run to the end of the window.
        max_tokens=OWN_TASK_MAX_TOKENS if "own_task_id" in claim else None,
    )
    agent = dspy.ReAct(Solve, tools=[calculator], max_iters=claim["max_turns"])
    try:
        with dspy.context(lm=lm):
            prediction = await agent.acall(task=claim["prompt"])
        text = f"<answer>{prediction.answer}</answer>"
    except (DSPyError, openai.APIError):
        # No reply DSPy could parse, even as JSON, or a call the node refused (the
        # transcript outgrew the window): no answer. A withdrawn claim's close is refused
        # too, with the ``openai`` error the worker expects.
        text = None
    reward = score(claim, text)
    await close_episode(client, claim, reward)
    return reward, calls


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__.split("\n\n")[0]), dspy_calculator_agent))
