"""Twin cities of the capitals of made-up countries: a task whose answer needs a chain of two
tool calls, the second's argument read from the first's result
(``configs/smollm2_multihop_tools_cpu.yaml``).

``capital_chain``: the agent is asked for the twin city of the capital of a country of
:data:`~tunix_agentic.envs.capital_lookup.TABLE` (invented, as for ``capital_lookup``).
``lookup(country)`` returns ``"<country>: the capital is <city>."``; ``twin(city)`` returns
``"<city>: the twin city is <twin>."`` for a capital of the table and refuses anything else
(a country's name included), so the only way to the answer is to call ``lookup``, read the
capital it names and pass that to ``twin``. Twin cities are invented too (:data:`TWINS`,
from a fixed seed; no name shared with a country, a capital or a real place), so no model
can guess a link. The reply must end with ``The answer is <twin>.``

The checker scores only the final answer (1.0 for the twin city, else 0.0), however it
was reached. A partial, per-step reward is an option (``step_reward``, default 0): a tool
turn earns ``step_reward`` for each link of the chain it finds first, the asked country's
capital (from ``lookup``) and then that capital's twin (from ``twin``, only once the capital
has been returned). It is kept on the trajectory's steps, never added to the outcome; the
learner uses it with ``learner.turn_advantage: true`` under a context rule that gives one
learner row per step (``agent.context_rule: sliding_window``).

Each episode reports ``info["metrics"]`` (logged as ``rollout/env/<name>``, summed per
episode): ``tool_calls`` (the calls it made), ``found_capital`` and ``found_twin`` (1 once
each link was found). Episodes run as ``capital_lookup``'s do: tool turns until one
without a call, which is the answer. The ``train`` and ``heldout`` splits share no
country, so no capital and no twin city either
(:func:`~tunix_agentic.envs.capital_lookup.country_split`).
Register it with ``env.import: tunix_agentic.envs.capital_chain``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_agentic.envs.answer_format import CAPITALS, final_word_answer
from tunix_agentic.envs.base import Action, StepResult, register_env
from tunix_agentic.envs.capital_lookup import (
    TABLE,
    CapitalLookupEnv,
    LookupTasks,
    city_name,
    find_country,
    lookup_text,
    name_key,
)
from tunix_agentic.envs.tool_env import tool
from tunix_agentic.envs.tools import ToolError

_TWIN_SEED = 20261211  # fixed, as the table: every run, seed and process sees the same world
PROMPT = (
    "What is the twin city of the capital of {country}? Find the capital with the lookup "
    "tool, then its twin city with the twin tool, then end your reply with "
    '"The answer is X." where X is the twin city.'
)


def _make_twins(capitals: list[str], seed: int) -> dict[str, str]:
    """An invented twin city for each of ``capitals``, the same for a given seed: no name
    twice, none a country or capital of the table or a real place."""
    rng = np.random.default_rng(seed)
    used = {name.lower() for pair in CAPITALS.items() for name in pair}
    used |= {name.lower() for pair in TABLE.items() for name in pair}
    twins: dict[str, str] = {}
    for capital in capitals:
        twin = city_name(rng)
        while twin.lower() in used:
            twin = city_name(rng)
        used.add(twin.lower())
        twins[capital] = twin
    return twins


#: The invented world's second table: capital -> its twin city.
TWINS: dict[str, str] = _make_twins(list(TABLE.values()), _TWIN_SEED)
_CAPITAL_BY_KEY = {capital.lower(): capital for capital in TWINS}


def twin_text(city: str) -> str:
    """What the ``twin`` tool returns for a capital of the table."""
    return f"{city}: the twin city is {TWINS[city]}."


@dataclass(frozen=True)
class ChainTask:
    """One question: the country asked about, its capital (the first link) and the
    capital's twin city (the answer)."""

    task_id: str
    prompt: str
    country: str
    capital: str
    answer: str
    task_name: str = "capital_chain"


class ChainTasks(LookupTasks):
    """``capital_lookup``'s countries in the same seeded order per split, asked for their
    capital's twin. A demonstration either follows the whole chain (``lookup``, then
    ``twin`` on the capital it returned, then the answer) or answers at once with a made-up
    city (wrong): ``sft.tool_fraction`` sets the mix, so the warm start shows the chain only
    part of the time and RL teaches it to follow it every time."""

    def task(self, index: int, *, seed: int, split: str) -> ChainTask:
        asked = super().task(index, seed=seed, split=split)
        capital = asked.answer
        return ChainTask(
            asked.task_id,
            PROMPT.format(country=asked.country),
            asked.country,
            capital,
            TWINS[capital],
        )

    def demonstration(
        self, task: ChainTask, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        if use_tools:
            first = {"name": "lookup", "arguments": {"country": task.country}}
            second = {"name": "twin", "arguments": {"city": task.capital}}
            return [
                {"role": "assistant", "content": "", "tool_calls": [first]},
                {"role": "tool", "content": lookup_text(task.country)},
                {"role": "assistant", "content": "", "tool_calls": [second]},
                {"role": "tool", "content": twin_text(task.capital)},
                {"role": "assistant", "content": f"The answer is {task.answer}."},
            ]
        guess = city_name(rng)
        if guess.lower() == task.answer.lower():  # a guess is never right by chance
            guess += "a"
        return [{"role": "assistant", "content": f"The answer is {guess}."}]


@register_env("capital_chain", tasks=ChainTasks(), client_kwargs=("tool_timeout", "step_reward"))
class CapitalChainEnv(CapitalLookupEnv):
    """The twin city of an invented country's capital, with ``capital_lookup``'s ``lookup``
    tool (which marks the first link found) and a ``twin`` tool (see the module).
    ``step_reward``: the per-step reward for each link of the chain a tool turn finds
    first (0: none, the default)."""

    def __init__(self, *, tool_timeout: float | None = None, step_reward: float = 0.0) -> None:
        super().__init__(tool_timeout=tool_timeout)
        if not (math.isfinite(step_reward) and step_reward >= 0):
            raise ValueError(f"step_reward must be a finite number >= 0, got {step_reward!r}")
        self.step_reward = float(step_reward)
        self._found_twin = False

    @tool
    def twin(self, city: str) -> str:
        """The twin city of a capital, from the world's table of twin cities."""
        found = _CAPITAL_BY_KEY.get(name_key(city))
        if found is None:
            hint = " (a country: lookup gives its capital)" if find_country(city) else ""
            raise ToolError(f"no city named {city!r} in the table of twin cities{hint}")
        # The second link counts once the first was returned: its argument came from there.
        if self.task is not None and found == self.task.capital and self._right_lookup:
            self._found_twin = True
        return twin_text(found)

    async def reset(self, task: Any) -> str:
        if not isinstance(task, ChainTask):
            raise TypeError(f"CapitalChainEnv needs a ChainTask, got {type(task).__name__}")
        self.task, self.outcome = task, None
        self._right_lookup = self._found_twin = False
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        if self.outcome is not None:
            raise RuntimeError("step() after the episode ended")
        if action.tool_calls or action.parse_errors:
            before = (self._right_lookup, self._found_twin)
            result = await self.run_tools(action)
            new_capital = float(self._right_lookup and not before[0])
            new_twin = float(self._found_twin and not before[1])
            result.reward = self.step_reward * (new_capital + new_twin)
            # Summed over the episode's steps; every step reports all three, so every
            # episode counts in the means.
            result.info["metrics"] = {
                "tool_calls": float(len(action.tool_calls)),
                "found_capital": new_capital,
                "found_twin": new_twin,
            }
            return result
        given = action.answer if action.answer is not None else final_word_answer(action.text)
        right = given is not None and given.strip().lower() == self.task.answer.lower()
        self.outcome = 1.0 if right else 0.0
        info = {
            "status": "answered" if given is not None else "no_answer",
            "metrics": {"tool_calls": 0.0, "found_capital": 0.0, "found_twin": 0.0},
        }
        return StepResult("", self.outcome, True, info)
