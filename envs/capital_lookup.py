"""Capitals of made-up countries, found with a ``lookup`` tool: a multi-turn task where the
tool is needed (``configs/smollm2_capitals_tools_cpu.yaml``).

``capital_lookup``: the agent is asked for the capital of a country that exists only in
:data:`TABLE`, a table of invented names made here from a fixed seed, so no pretrained
model can know the answer or guess it. It may call ``lookup(country)``, which returns
``"<country>: the capital is <city>."`` as a ``tool`` message; it must end its reply with
``The answer is <city>.`` Reward 1.0 when the reply's last such sentence names the city,
else 0.0. An episode is: a turn of tool calls (run, reported in ``info["tool_calls"]``,
as every :class:`~tunix_agentic.envs.tool_env.ToolEnvironment` does), then more turns until
one without a call, which is the answer; a turn that calls a tool and also states an
answer is a tool turn (the answer waits for the tool's reply). Each episode also reports
``info["metrics"]``: ``lookups`` (calls made) and ``right_lookup`` (1 if the asked
country was looked up), logged as ``rollout/env/lookups`` and ``rollout/env/right_lookup``.

The ``train`` and ``heldout`` splits share no country (a stable hash of the name).
Register it with ``env.import: tunix_agentic.envs.capital_lookup``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_agentic.envs.answer_format import CAPITALS, final_word_answer
from tunix_agentic.envs.base import SPLITS, Action, StepResult, TaskSource, register_env
from tunix_agentic.envs.tool_env import ToolEnvironment, tool
from tunix_agentic.envs.tools import ToolError

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "kr", "st", "tr", "th")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou")
_CODAS = ("", "", "n", "r", "s", "l")
_COUNTRY_ENDS = ("ia", "land", "stan", "ora", "esh", "ar")
_TABLE_SEED = 20261204  # the table is fixed: every run, seed and process sees the same world
TABLE_SIZE = 480
PROMPT = (
    "What is the capital of {country}? Look it up with the lookup tool, then end your reply "
    'with "The answer is X." where X is the city.'
)


def _syllable(rng: np.random.Generator) -> str:
    return "".join(str(rng.choice(part)) for part in (_ONSETS, _VOWELS, _CODAS))


def city_name(rng: np.random.Generator) -> str:
    """An invented city name of two syllables (``Drouzmae``), drawn from ``rng``."""
    return (_syllable(rng) + _syllable(rng)).capitalize()


def _make_table(size: int, seed: int) -> dict[str, str]:
    """``size`` invented countries and their invented capitals, the same for a given seed:
    no name twice, none a real country (:data:`~tunix_agentic.envs.answer_format.CAPITALS`)
    or a real capital, no capital named like its country."""
    rng = np.random.default_rng(seed)
    real = {name.lower() for pair in CAPITALS.items() for name in pair}
    table: dict[str, str] = {}
    used: set[str] = set(real)
    while len(table) < size:
        country = _syllable(rng) + str(rng.choice(_ONSETS)) + str(rng.choice(_COUNTRY_ENDS))
        country = country.capitalize()
        city = city_name(rng)
        if country.lower() in used or city.lower() in used:
            continue
        used |= {country.lower(), city.lower()}
        table[country] = city
    return table


#: The invented world: country -> capital.
TABLE: dict[str, str] = _make_table(TABLE_SIZE, _TABLE_SEED)
_BY_KEY = {country.lower(): country for country in TABLE}


def name_key(name: str) -> str:
    """``name`` as the tables are keyed: whatever its case, surrounding spaces or closing
    ``.?!`` (a model's spelling varies)."""
    return name.strip().strip(".?!").strip().lower()


def find_country(name: str) -> str | None:
    """The country of :data:`TABLE` that ``name`` spells (:func:`name_key`); None if there
    is none."""
    return _BY_KEY.get(name_key(name))


def country_split(country: str) -> str:
    """A quarter of the countries (by a stable hash of the name) are held out."""
    return "heldout" if zlib.crc32(country.encode()) % 4 == 0 else "train"


def lookup_text(country: str) -> str:
    """What the ``lookup`` tool returns for a country of :data:`TABLE`."""
    return f"{country}: the capital is {TABLE[country]}."


@dataclass(frozen=True)
class LookupTask:
    """One question: the country asked about and its capital (the answer)."""

    task_id: str
    prompt: str
    country: str
    answer: str
    task_name: str = "capital_lookup"


class LookupTasks(TaskSource):
    """Countries of :data:`TABLE`, in a seeded order per split. Demonstrations (for an SFT
    warm start) either look the country up and answer with the tool's city, or answer at
    once with a made-up city (wrong): ``sft.tool_fraction`` sets the mix, so a warm-started
    policy calls the tool only part of the time and RL teaches it to always do so."""

    def __init__(self) -> None:
        self._countries = {
            split: [c for c in TABLE if country_split(c) == split] for split in SPLITS
        }

    def num_tasks(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return len(self._countries[split])

    def task(self, index: int, *, seed: int, split: str) -> LookupTask:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        countries = self._countries[split]
        order = np.random.default_rng([int(seed), zlib.crc32(split.encode())]).permutation(
            len(countries)
        )
        country = countries[int(order[index % len(countries)])]
        return LookupTask(
            f"{split}-{seed}-{index}", PROMPT.format(country=country), country, TABLE[country]
        )

    def demonstration(
        self, task: LookupTask, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        if use_tools:
            call = {"name": "lookup", "arguments": {"country": task.country}}
            return [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": lookup_text(task.country)},
                {"role": "assistant", "content": f"The answer is {task.answer}."},
            ]
        guess = city_name(rng)
        if guess.lower() == task.answer.lower():  # a guess is never right by chance
            guess += "a"
        return [{"role": "assistant", "content": f"The answer is {guess}."}]


@register_env("capital_lookup", tasks=LookupTasks(), client_kwargs=("tool_timeout",))
class CapitalLookupEnv(ToolEnvironment):
    """The capital of an invented country, with a ``lookup`` tool (see the module)."""

    default_tool_timeout = 5.0

    def __init__(self, *, tool_timeout: float | None = None) -> None:
        super().__init__(tool_timeout=tool_timeout)
        self._right_lookup = False

    @tool
    def lookup(self, country: str) -> str:
        """The capital of a country, from the world's table of countries."""
        found = find_country(country)
        if found is None:
            raise ToolError(f"no country named {country!r} in the table")
        if self.task is not None and found == self.task.country:
            self._right_lookup = True
        return lookup_text(found)

    async def reset(self, task: Any) -> str:
        if not isinstance(task, LookupTask):
            raise TypeError(f"CapitalLookupEnv needs a LookupTask, got {type(task).__name__}")
        self.task, self.outcome = task, None
        self._right_lookup = False
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        if self.outcome is not None:
            raise RuntimeError("step() after the episode ended")
        if action.tool_calls or action.parse_errors:
            found_before = self._right_lookup
            result = await self.run_tools(action)
            # Summed over the episode's steps: the calls made, and 1 once the asked country
            # was looked up (every step reports both, so every episode counts in the mean).
            result.info["metrics"] = {
                "lookups": float(len(action.tool_calls)),
                "right_lookup": float(self._right_lookup and not found_before),
            }
            return result
        given = action.answer if action.answer is not None else final_word_answer(action.text)
        right = given is not None and given.strip().lower() == self.task.answer.lower()
        self.outcome = 1.0 if right else 0.0
        info = {
            "status": "answered" if given is not None else "no_answer",
            "metrics": {"lookups": 0.0, "right_lookup": 0.0},
        }
        return StepResult("", self.outcome, True, info)
