"""Questions answered in a required sentence, without tools: tasks a small real model can
learn on a CPU (``configs/smollm2_capitals_cpu.yaml``).

``capital_format``: the agent is asked for a country's capital and must end its reply
with ``The answer is Paris.``; ``arithmetic_format``: ``What is 37 + 48?``, ending with
``The answer is 85.``. Reward 1.0 when the reply's last such sentence holds the right
answer, else 0.0; one turn per episode. A pretrained instruct model
(SmolLM2-135M-Instruct) knows many capitals but often answers in prose without the
sentence, so it starts well below the ceiling and reinforcement teaches it the format
(two-digit sums it mostly gets wrong: a harder task). The ``train`` and ``heldout``
splits never share a question (split by a stable hash).
Register them with ``env.import: tunix_agentic.envs.answer_format``.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_agentic.envs.base import (
    SPLITS,
    Action,
    Environment,
    StepResult,
    TaskSource,
    register_env,
    score_off_loop,
)

# Both readers are linear in the reply's length: no pattern here can match one stretch of
# text in more than one way (a run of spaces once took 46.6 s on the event loop).
_SENTENCE = re.compile(r"the answer is:?\s*(?:\$\s*)?(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_LEAD = re.compile(r"the answer is", re.IGNORECASE)
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz '-")
_STOPS = ".!\n"
PROMPT = 'What is {a} + {b}? End your reply with "The answer is N." where N is the number.'


@dataclass(frozen=True)
class SumTask:
    """One question and its answer."""

    task_id: str
    prompt: str
    answer: int
    task_name: str = "arithmetic_format"


def make_sum_task(index: int, *, seed: int, split: str, low: int = 10, high: int = 99) -> SumTask:
    """The ``index``-th task of ``split``: two operands in ``[low, high]``; the same inputs
    always give the same task, and the splits are disjoint."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index)])
    while True:
        a, b = (int(v) for v in rng.integers(low, high + 1, size=2))
        in_heldout = zlib.crc32(f"{a}+{b}".encode()) % 10 == 0
        if in_heldout == (split == "heldout"):
            break
    return SumTask(f"{split}-{seed}-{index}", PROMPT.format(a=a, b=b), a + b)


def final_answer(text: str) -> str | None:
    """The number of the reply's last "The answer is N" (None if there is none)."""
    found = _SENTENCE.findall(text)
    return found[-1] if found else None


class SumTasks(TaskSource):
    """:func:`make_sum_task`; demonstrations answer in the required sentence."""

    def task(self, index: int, *, seed: int, split: str) -> SumTask:
        return make_sum_task(index, seed=seed, split=split)

    def demonstration(
        self, task: SumTask, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": f"The answer is {task.answer}."}]


class _OneSentenceEnv(Environment):
    """One turn: reward 1.0 if the reply's last "The answer is ..." holds the right answer.

    A subclass names its task type and reads the answer out of the reply (``given``, None
    when the reply has no such sentence) and says whether it is right (``is_right``).
    """

    task_type: type

    def __init__(self) -> None:
        super().__init__()
        self._task: Any = None
        self._reward = 0.0

    def given(self, text: str) -> str | None:
        raise NotImplementedError

    def is_right(self, given: str, answer: Any) -> bool:
        raise NotImplementedError

    async def reset(self, task: Any) -> str:
        if not isinstance(task, self.task_type):
            raise TypeError(
                f"{type(self).__name__} needs a {self.task_type.__name__}, "
                f"got {type(task).__name__}"
            )
        self._task, self._reward, self.step_rewards = task, 0.0, []
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        given = await score_off_loop(self.given, action.text, timeout=self.reward_timeout_s)
        self._reward = 1.0 if given is not None and self.is_right(given, self._task.answer) else 0.0
        self.step_rewards.append(self._reward)
        status = "answered" if given is not None else "no_answer"
        return StepResult(observation="", reward=self._reward, done=True, info={"status": status})

    async def evaluate(self) -> float:
        return self._reward


@register_env("arithmetic_format", tasks=SumTasks())
class AnswerFormatEnv(_OneSentenceEnv):
    """``What is 37 + 48?``, answered ``The answer is 85.``"""

    task_type = SumTask

    def given(self, text: str) -> str | None:
        return final_answer(text)

    def is_right(self, given: str, answer: Any) -> bool:
        return float(given) == answer


# ------------------------------------------------------------------ capitals
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Ireland": "Dublin", "Belgium": "Brussels",
    "Netherlands": "Amsterdam", "Austria": "Vienna", "Switzerland": "Bern",
    "Poland": "Warsaw", "Czechia": "Prague", "Hungary": "Budapest", "Greece": "Athens",
    "Sweden": "Stockholm", "Norway": "Oslo", "Denmark": "Copenhagen", "Finland": "Helsinki",
    "Iceland": "Reykjavik", "Russia": "Moscow", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Turkey": "Ankara",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja", "Ghana": "Accra",
    "Ethiopia": "Addis Ababa", "Morocco": "Rabat", "Algeria": "Algiers", "Tunisia": "Tunis",
    "South Africa": "Pretoria", "Senegal": "Dakar", "Uganda": "Kampala", "Japan": "Tokyo",
    "China": "Beijing", "South Korea": "Seoul", "North Korea": "Pyongyang",
    "India": "New Delhi", "Pakistan": "Islamabad", "Bangladesh": "Dhaka",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Indonesia": "Jakarta",
    "Philippines": "Manila", "Malaysia": "Kuala Lumpur", "Nepal": "Kathmandu",
    "Iran": "Tehran", "Iraq": "Baghdad", "Saudi Arabia": "Riyadh", "Israel": "Jerusalem",
    "Jordan": "Amman", "Lebanon": "Beirut", "Syria": "Damascus", "Afghanistan": "Kabul",
    "Qatar": "Doha", "Mongolia": "Ulaanbaatar", "Australia": "Canberra",
    "New Zealand": "Wellington", "Canada": "Ottawa", "United States": "Washington",
    "Mexico": "Mexico City", "Cuba": "Havana", "Jamaica": "Kingston", "Brazil": "Brasilia",
    "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota",
    "Venezuela": "Caracas", "Ecuador": "Quito", "Uruguay": "Montevideo",
    "Paraguay": "Asuncion", "Bolivia": "Sucre", "United Kingdom": "London",
    "Scotland": "Edinburgh", "Wales": "Cardiff", "Estonia": "Tallinn", "Latvia": "Riga",
    "Lithuania": "Vilnius", "Slovakia": "Bratislava", "Slovenia": "Ljubljana",
    "Albania": "Tirana", "Cyprus": "Nicosia", "Malta": "Valletta",
    "Luxembourg": "Luxembourg City",
    "Georgia": "Tbilisi", "Armenia": "Yerevan", "Azerbaijan": "Baku",
    "Kazakhstan": "Astana", "Uzbekistan": "Tashkent", "Sri Lanka": "Colombo",
    "Myanmar": "Naypyidaw", "Cambodia": "Phnom Penh", "Laos": "Vientiane",
    "Taiwan": "Taipei", "Libya": "Tripoli", "Sudan": "Khartoum",
    "Tanzania": "Dodoma", "Zimbabwe": "Harare", "Zambia": "Lusaka", "Angola": "Luanda",
    "Mali": "Bamako", "Cameroon": "Yaounde", "Rwanda": "Kigali", "Somalia": "Mogadishu",
}  # fmt: skip
CAPITAL_PROMPT = (
    'What is the capital of {country}? End your reply with "The answer is X." where X is the city.'
)


def capital_split(country: str) -> str:
    """A third of the countries (by a stable hash of the name) are held out."""
    return "heldout" if zlib.crc32(country.encode()) % 3 == 0 else "train"


@dataclass(frozen=True)
class CapitalTask:
    task_id: str
    prompt: str
    answer: str
    task_name: str = "capital_format"


def final_word_answer(text: str) -> str | None:
    """The words after the reply's last "The answer is" that is followed by an answer (None
    if there is none).

    An answer, after an optional colon and optional ``**`` emphasis, is a letter, then
    letters, spaces, apostrophes and hyphens up to the end of its sentence (``.``, ``!``, a
    newline or the end of the reply), where only spaces and a closing ``**`` may come
    between it and the stop. Each "The answer is" reads only the text up to the next one,
    so the work is linear in the reply's length.
    """
    leads = list(_LEAD.finditer(text))
    for k in reversed(range(len(leads))):
        end = leads[k + 1].start() if k + 1 < len(leads) else len(text)
        found = _words_at(text, leads[k].end(), end)
        if found is not None:
            return found
    return None


def _skip(text: str, i: int, end: int, chars: str | None) -> int:
    """The first index from ``i`` (before ``end``) not in ``chars`` (None: whitespace)."""
    while i < end and (text[i].isspace() if chars is None else text[i] in chars):
        i += 1
    return i


def _words_at(text: str, i: int, end: int) -> str | None:
    """The answer that starts at ``text[i]`` (just after "the answer is"), read before ``end``."""
    i += i < end and text[i] == ":"
    i = _skip(text, _skip(text, _skip(text, i, end, None), end, "*"), end, None)
    if not (i < end and text[i].isascii() and text[i].isalpha()):
        return None
    j = i
    while j < end and text[j] in _WORD_CHARS:
        j += 1
    # What follows the words: spaces (part of the run above), then a closing ** and more
    # whitespace, before a stop; a newline among that whitespace is itself a stop.
    k = _skip(text, j, end, None)
    if "\n" not in text[j:k]:
        k = _skip(text, _skip(text, k, end, "*"), end, None)
    if "\n" in text[j:k] or (k == len(text)) or (k < end and text[k] in _STOPS):
        return text[i:j].strip() or None
    return None


class CapitalTasks(TaskSource):
    """Countries of :data:`CAPITALS`, in a seeded order per split."""

    def num_tasks(self, split: str) -> int:
        return sum(capital_split(c) == split for c in CAPITALS)

    def task(self, index: int, *, seed: int, split: str) -> CapitalTask:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        countries = [c for c in CAPITALS if capital_split(c) == split]
        order = np.random.default_rng([int(seed), zlib.crc32(split.encode())]).permutation(
            len(countries)
        )
        country = countries[int(order[index % len(countries)])]
        return CapitalTask(
            f"{split}-{seed}-{index}", CAPITAL_PROMPT.format(country=country), CAPITALS[country]
        )

    def demonstration(
        self, task: CapitalTask, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": f"The answer is {task.answer}."}]


@register_env("capital_format", tasks=CapitalTasks())
class CapitalFormatEnv(_OneSentenceEnv):
    """A country's capital, answered ``The answer is Paris.``"""

    task_type = CapitalTask

    def given(self, text: str) -> str | None:
        return final_word_answer(text)

    def is_right(self, given: str, answer: Any) -> bool:
        return given.lower() == answer.lower()
