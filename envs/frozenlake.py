"""FrozenLake as text: a multi-turn grid game with a move budget (after RAGEN's FrozenLake).

The agent stands on a small grid of frozen tiles ``F``, holes ``H`` and a goal ``G``
(``S`` marks where it started, ``P`` where it is) and moves one turn at a time by
answering ``<answer>Right</answer>``; a turn may chain up to ``max_actions_per_turn``
moves as ``<answer>Right || Down</answer>``. Moves are ``Up``, ``Down``, ``Left`` and
``Right`` (any letter case). Walking into the edge leaves the agent where it is; a hole
ends the episode; the goal ends it with reward 1.0. Anything else (no ``<answer>``, an
unknown move, too many moves, a tool call) is an invalid action: the agent sees why,
next to the unchanged board, and pays ``invalid_action_penalty``.

Each step's reward (the goal's 1.0, minus ``step_penalty`` per move and the invalid
action penalty) is recorded as that step's reward, and :meth:`FrozenLakeEnv.evaluate`
returns their sum: 1.0 for a clean success, 0 for a hole or running out of turns when
both penalties are zero.

The ice may be slippery (``slip_prob`` of the task): a move then goes sideways with that
probability. Slips are drawn from the task's ``seed`` and the move's index, so an episode
is reproducible and every member of a group sees the same ice.

:class:`FrozenLakeTasks` generates solvable maps deterministically from ``(seed, split,
index)``; the ``train`` and ``heldout`` splits never share a map (a stable hash of the map
text assigns it to one), and its demonstrations walk a shortest path one move per turn.
Every prompt and observation is printable ASCII, so the built-in character tokenizer
encodes them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunix_agentic.envs.base import (
    SPLITS,
    Action,
    Environment,
    StepResult,
    Task,
    TaskSource,
    register_env,
)

# Gym's order (0 Left, 1 Down, 2 Right, 3 Up): a slip turns a move by +-1 in this cycle,
# i.e. to one of the two perpendicular directions.
DIRECTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
_DELTAS: dict[str, tuple[int, int]] = {
    "Left": (0, -1),
    "Down": (1, 0),
    "Right": (0, 1),
    "Up": (-1, 0),
}
_BY_LOWER = {d.lower(): d for d in DIRECTIONS}
TILES = "SFHG"
ACTION_SEPARATOR = "||"
_HELDOUT_BUCKETS = 10  # one map in ten (by a stable hash of its text) is held out.
_MAX_DRAWS = 100_000  # generation gives up (RuntimeError) after this many rejected maps.


# ------------------------------------------------------------------------------ the map
def check_grid(grid: Any) -> tuple[str, ...]:
    """``grid`` (a sequence of equal-length row strings over ``S F H G``, exactly one ``S``
    and one ``G``) as a tuple of rows; ``ValueError`` saying what is wrong otherwise."""
    if isinstance(grid, str) or not isinstance(grid, Sequence) or not grid:
        raise ValueError(f"grid must be a non-empty list of row strings, got {grid!r:.100}")
    rows = tuple(grid)
    if not all(isinstance(row, str) and row for row in rows):
        raise ValueError("grid rows must be non-empty strings")
    if len({len(row) for row in rows}) != 1:
        raise ValueError("grid rows must all have the same length")
    text = "".join(rows)
    if set(text) - set(TILES):
        raise ValueError(
            f"grid tiles must be among {TILES!r}, got {sorted(set(text) - set(TILES))}"
        )
    if text.count("S") != 1 or text.count("G") != 1:
        raise ValueError("grid must hold exactly one start S and one goal G")
    return rows


def _find(rows: tuple[str, ...], tile: str) -> tuple[int, int]:
    for r, row in enumerate(rows):
        if tile in row:
            return r, row.index(tile)
    raise ValueError(f"grid has no {tile!r}")


def map_split(rows: Sequence[str]) -> str:
    """The split a map belongs to, by a stable hash of its text."""
    text = "\n".join(rows)
    return "heldout" if zlib.crc32(text.encode()) % _HELDOUT_BUCKETS == 0 else "train"


def slip_turn(seed: int, move_index: int, slip_prob: float) -> int:
    """How a slippery move turns: 0 (as intended), +1 or -1 (a step along
    :data:`DIRECTIONS`, a perpendicular direction), drawn from ``(seed, move_index)``."""
    if slip_prob <= 0.0:
        return 0
    # SeedSequence mixes the integers stably across processes (unlike the salted hash()).
    draw, side = np.random.default_rng([int(seed), int(move_index)]).random(2)
    if draw >= slip_prob:
        return 0
    return 1 if side < 0.5 else -1


@dataclasses.dataclass(frozen=True)
class MoveOutcome:
    """One move: what was asked, where it went (after a slip), and what it ran into."""

    intended: str
    direction: str
    bumped: bool  # it pushed against the edge and stayed put
    tile: str  # the tile it ended on

    def describe(self) -> str:
        text = f"Moved {self.intended}"
        if self.direction != self.intended:
            text += f" but slipped {self.direction}"
        if self.bumped:
            text += " into the edge and stayed"
        return text + "."


class FrozenLakeGame:
    """The game's state and rules without the chat: a position, a move counter, and moves.

    Shared by :class:`FrozenLakeEnv` and the demonstrations, so a demonstration's
    observations are exactly what the environment would answer.
    """

    def __init__(self, grid: Sequence[str], *, seed: int = 0, slip_prob: float = 0.0):
        self.rows = check_grid(grid)
        if not 0.0 <= slip_prob < 1.0:
            raise ValueError(f"slip_prob must be in [0, 1), got {slip_prob}")
        self.seed = int(seed)
        self.slip_prob = float(slip_prob)
        self.position = _find(self.rows, "S")
        self.moves_made = 0

    @property
    def tile(self) -> str:
        r, c = self.position
        return self.rows[r][c]

    @property
    def finished(self) -> bool:
        """On the goal or in a hole."""
        return self.tile in "GH"

    def move(self, direction: str) -> MoveOutcome:
        """Applies one move (one of :data:`DIRECTIONS`); raises ``RuntimeError`` once finished."""
        if self.finished:
            raise RuntimeError("the game is over")
        turn = slip_turn(self.seed, self.moves_made, self.slip_prob)
        actual = DIRECTIONS[(DIRECTIONS.index(direction) + turn) % len(DIRECTIONS)]
        self.moves_made += 1
        target = _step(self.rows, self.position, actual)
        bumped = target == self.position
        self.position = target
        return MoveOutcome(direction, actual, bumped, self.tile)

    def render(self) -> str:
        """The board, one row per line, with ``P`` on the agent's tile."""
        r, c = self.position
        rows = list(self.rows)
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        return "\n".join(rows)


def _step(rows: tuple[str, ...], position: tuple[int, int], direction: str) -> tuple[int, int]:
    dr, dc = _DELTAS[direction]
    r, c = position[0] + dr, position[1] + dc
    if 0 <= r < len(rows) and 0 <= c < len(rows[0]):
        return r, c
    return position


def shortest_moves(
    grid: Sequence[str],
    *,
    seed: int = 0,
    slip_prob: float = 0.0,
    horizon: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[str] | None:
    """A shortest list of moves from ``S`` to ``G`` that never enters a hole, or None.

    Breadth-first search; with slippery ice it searches (position, move index) states,
    with the slips the game will draw, so the moves reach the goal when replayed. At most
    ``horizon`` moves (default: four per tile). ``rng`` shuffles the order moves are
    tried in, which picks one of several shortest paths.
    """
    rows = check_grid(grid)
    horizon = 4 * len(rows) * len(rows[0]) if horizon is None else horizon
    start, goal = _find(rows, "S"), _find(rows, "G")
    slippery = slip_prob > 0.0

    def key(pos: tuple[int, int], t: int) -> Any:
        return (pos, t) if slippery else pos

    parents: dict[Any, tuple[Any, str] | None] = {key(start, 0): None}
    queue = collections.deque([(start, 0)])
    while queue:
        pos, t = queue.popleft()
        if pos == goal:
            moves: list[str] = []
            node = parents[key(pos, t)]
            while node is not None:
                previous, move = node
                moves.append(move)
                node = parents[previous]
            return moves[::-1]
        if t >= horizon:
            continue
        turn = slip_turn(seed, t, slip_prob)
        order = list(DIRECTIONS) if rng is None else [DIRECTIONS[i] for i in rng.permutation(4)]
        for move in order:
            actual = DIRECTIONS[(DIRECTIONS.index(move) + turn) % len(DIRECTIONS)]
            nxt = _step(rows, pos, actual)
            if rows[nxt[0]][nxt[1]] == "H" or key(nxt, t + 1) in parents:
                continue
            parents[key(nxt, t + 1)] = (key(pos, t), move)
            queue.append((nxt, t + 1))
    return None


# ------------------------------------------------------------------------------ text
def frozenlake_prompt(game: FrozenLakeGame) -> str:
    """The first user turn: the rules, the action format and the board."""
    slippery = " The ice is slippery: a move may slide sideways." if game.slip_prob else ""
    return (
        "FrozenLake: reach the goal G from your position P. F is ice you can walk on; "
        "stepping into a hole H ends the game." + slippery + " Reply with one move, "
        "<answer>Up</answer>, <answer>Down</answer>, <answer>Left</answer> or "
        "<answer>Right</answer>, or chain moves as <answer>Up || Left</answer>.\n\n" + game.render()
    )


def turn_observation(outcomes: Sequence[MoveOutcome], game: FrozenLakeGame) -> str:
    """What the agent sees after a valid turn that did not end the game."""
    return " ".join(o.describe() for o in outcomes) + "\n" + game.render()


def parse_moves(action: Action, max_actions: int) -> tuple[list[str], str | None]:
    """``(moves, None)`` for a valid action, else ``([], why it is invalid)``."""
    if action.tool_calls or action.parse_errors:
        return [], "this game has no tools"
    if action.answer is None:
        return [], "no <answer>...</answer> in your reply"
    parts = [part.strip() for part in action.answer.split(ACTION_SEPARATOR)]
    if len(parts) > max_actions:
        return [], f"{len(parts)} moves in one turn, more than the limit of {max_actions}"
    moves = []
    for part in parts:
        move = _BY_LOWER.get(part.lower())
        if move is None:
            # Echo it in printable ASCII: the built-in tokenizer encodes nothing else.
            shown = ascii(part[:20])[1:-1]
            return [], f"unknown move '{shown}'"
        moves.append(move)
    return moves, None


# ------------------------------------------------------------------------------ tasks
@dataclasses.dataclass(frozen=True)
class FrozenLakeTasks(TaskSource):
    """Generated FrozenLake maps: ``size`` x ``size``, each tile a hole with probability
    ``hole_prob`` (start and goal excepted), start and goal placed at random.

    Only maps with a path from ``S`` to ``G`` are kept (with slippery ice: a path given the
    slips that map's seed draws, within four moves per tile). A task is a
    :class:`~tunix_agentic.envs.base.Task` whose ``data`` holds ``grid`` (the rows),
    ``seed`` (the slips' seed) and ``slip_prob``; its ``answer`` is the length of a
    shortest solution. ``size`` is at least 3 (smaller boards have too few distinct maps to
    split).
    """

    size: int = 4
    hole_prob: float = 0.2
    slip_prob: float = 0.0

    def __post_init__(self) -> None:
        if not 3 <= self.size <= 12:
            raise ValueError(f"size must be in [3, 12], got {self.size}")
        if not 0.0 <= self.hole_prob <= 0.6:
            raise ValueError(f"hole_prob must be in [0, 0.6], got {self.hole_prob}")
        if not 0.0 <= self.slip_prob < 1.0:
            raise ValueError(f"slip_prob must be in [0, 1), got {self.slip_prob}")

    def num_tasks(self, split: str) -> int:
        """1,000,000 train and 10,000 held-out indices (small boards repeat maps)."""
        return 1_000_000 if split == "train" else 10_000

    def task(self, index: int, *, seed: int, split: str) -> Task:
        """The ``index``-th map of ``split`` for ``seed``: the same inputs, the same map."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if seed < 0 or index < 0:
            raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
        rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index)])
        n = self.size
        for _ in range(_MAX_DRAWS):
            tiles = np.where(rng.random((n, n)) < self.hole_prob, "H", "F")
            start, goal = rng.choice(n * n, size=2, replace=False)
            tiles[divmod(int(start), n)] = "S"
            tiles[divmod(int(goal), n)] = "G"
            rows = tuple("".join(row) for row in tiles)
            episode_seed = int(rng.integers(0, 2**31))
            if map_split(rows) != split:
                continue
            path = shortest_moves(rows, seed=episode_seed, slip_prob=self.slip_prob)
            if path is not None:
                break
        else:
            raise RuntimeError(
                f"no solvable {split} map in {_MAX_DRAWS} draws: lower hole_prob or raise size"
            )
        game = FrozenLakeGame(rows, seed=episode_seed, slip_prob=self.slip_prob)
        return Task(
            task_id=f"frozenlake-{split}-{seed}-{index}",
            prompt=frozenlake_prompt(game),
            answer=len(path),
            data={"grid": rows, "seed": episode_seed, "slip_prob": self.slip_prob},
            task_name="frozenlake",
        )

    def demonstration(
        self, task: Task, *, rng: np.random.Generator, use_tools: bool = False
    ) -> list[dict[str, Any]]:
        """A shortest walk to the goal, one move per assistant turn, each followed (but the
        last) by the environment's observation as a user message. ``rng`` picks among
        shortest paths; ``use_tools`` is ignored (the game has no tools). Raises
        ``ValueError`` for a task whose map has no solution."""
        game = _game_of(task)
        moves = shortest_moves(game.rows, seed=game.seed, slip_prob=game.slip_prob, rng=rng)
        if moves is None:
            raise ValueError(f"task {task.task_id} has no solution")
        messages: list[dict[str, Any]] = []
        for move in moves:
            messages.append({"role": "assistant", "content": f"<answer>{move}</answer>"})
            outcome = game.move(move)
            if not game.finished:
                messages.append({"role": "user", "content": turn_observation([outcome], game)})
        return messages


def _game_of(task: Any) -> FrozenLakeGame:
    """The game a task describes (``task.data``: ``grid``, optional ``seed`` and ``slip_prob``)."""
    data = getattr(task, "data", None)
    if not isinstance(data, Mapping) or "grid" not in data:
        raise TypeError(
            f"FrozenLake needs a task whose data holds a 'grid', got {type(task).__name__}"
        )
    seed = data.get("seed", 0)
    slip = data.get("slip_prob", 0.0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task data 'seed' must be an integer, got {seed!r}")
    if isinstance(slip, bool) or not isinstance(slip, int | float) or not math.isfinite(slip):
        raise ValueError(f"task data 'slip_prob' must be a number, got {slip!r}")
    return FrozenLakeGame(data["grid"], seed=seed, slip_prob=float(slip))


# ------------------------------------------------------------------------------ the env
@dataclasses.dataclass(frozen=True)
class FrozenLakeRules:
    """The environment's knobs: the turn budget, moves per turn, and penalties
    (non-negative amounts subtracted from the reward)."""

    max_turns: int = 20
    max_actions_per_turn: int = 3
    step_penalty: float = 0.0
    invalid_action_penalty: float = 0.1

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        for name in ("step_penalty", "invalid_action_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


SUCCESS_REWARD = 1.0


@register_env(
    "frozenlake",
    tasks=FrozenLakeTasks(),
    client_kwargs=("max_turns", "max_actions_per_turn", "step_penalty", "invalid_action_penalty"),
)
class FrozenLakeEnv(Environment):
    """FrozenLake (see the module docstring): several turns per episode, no tools.

    A step's ``info`` holds ``status`` (``"moved"``, ``"invalid"``, ``"success"``,
    ``"hole"`` or ``"max_turns"``), ``position`` ``[row, col]``, ``moves`` (the directions
    taken, after slips), ``turn`` and ``success``. The episode ends on the goal, in a hole,
    or after ``max_turns`` turns (invalid ones included); moves after the one that ends it
    are ignored.
    """

    def __init__(
        self,
        *,
        max_turns: int = 20,
        max_actions_per_turn: int = 3,
        step_penalty: float = 0.0,
        invalid_action_penalty: float = 0.1,
    ) -> None:
        super().__init__()
        self.rules = FrozenLakeRules(
            max_turns, max_actions_per_turn, float(step_penalty), float(invalid_action_penalty)
        )
        self._game: FrozenLakeGame | None = None
        self._turns = 0
        self._done = False

    async def reset(self, task: Any) -> str:
        """Starts an episode on ``task`` (a :class:`Task` whose ``data`` holds ``grid``);
        returns its prompt (rendered from the map if the task has none)."""
        self._game = _game_of(task)
        self._turns = 0
        self._done = False
        self.step_rewards = []
        prompt = getattr(task, "prompt", "")
        return prompt if isinstance(prompt, str) and prompt else frozenlake_prompt(self._game)

    async def step(self, action: Action) -> StepResult:
        """Plays one turn; raises ``RuntimeError`` before ``reset`` or after the episode ends."""
        game = self._game
        if game is None:
            raise RuntimeError("step() called before reset()")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        rules = self.rules
        self._turns += 1
        moves, problem = parse_moves(action, rules.max_actions_per_turn)
        outcomes: list[MoveOutcome] = []
        if problem is not None:
            reward, status = -rules.invalid_action_penalty, "invalid"
            observation = (
                f"Invalid action: {problem}. Reply with <answer>Up</answer>, Down, Left or "
                f"Right (at most {rules.max_actions_per_turn} moves joined by ||).\n"
                + game.render()
            )
        else:
            reward, status = 0.0, "moved"
            for move in moves:
                outcomes.append(game.move(move))
                reward -= rules.step_penalty
                if game.finished:
                    break
            if game.tile == "G":
                reward += SUCCESS_REWARD
                status = "success"
            elif game.tile == "H":
                status = "hole"
            observation = turn_observation(outcomes, game)
        if status == "moved" or status == "invalid":
            if self._turns >= rules.max_turns:
                status = "max_turns"
        self._done = status in ("success", "hole", "max_turns")
        self.step_rewards.append(reward)
        info = {
            "status": status,
            "position": list(game.position),
            "moves": [o.direction for o in outcomes],
            "turn": self._turns,
            "success": status == "success",
        }
        return StepResult("" if self._done else observation, reward, self._done, info)
