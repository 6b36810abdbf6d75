"""A run's task sources: which environment each runs in and where its tasks come from.

Built from the config's ``tasks`` list, :class:`RunSources` gives the trainer
everything it needs without knowing any task family: the mixed train stream, the
held-out tasks per source, the environment for a task (picked by the task's
source name), and the demonstrations for a warm start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tunix_agentic.data.demos import DemoSource
from tunix_agentic.data.mixture import TaskMixture
from tunix_agentic.data.tasks import FileTaskSource, heldout_tasks, task_iterator
from tunix_agentic.envs.base import (
    Environment,
    TaskSource,
    env_tasks,
    get_env_factory,
    keyword_problem,
    make_env,
    offered_keywords,
)
from tunix_agentic.envs.tool_env import ToolEnvironment
from tunix_agentic.trajectory import TaskLike, task_key


class RunSources:
    """The run's task sources by name.

    A source's environment gets its ``env_kwargs``, over ``env_kwargs`` here when its
    environment is ``env_name`` (the config's ``env.kwargs`` for ``env.name``), and
    ``tool_timeout`` and ``sandbox`` when its factory takes them and they are not None.
    Raises ``ValueError`` naming the source whose environment has no registered tasks
    and no task files, whose files cannot be read, that has no train tasks, or whose
    environment does not take its keyword arguments.
    """

    def __init__(
        self,
        specs: Sequence[Any],
        *,
        tool_timeout: float | None = None,
        sandbox: Any = None,
        env_name: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ):
        # Each spec is a resolved ``tasks[i]`` of the config (TaskSourceConfig): name, env,
        # tasks_from, weight, seed_offset, train_file, heldout_file, env_kwargs.
        self.specs = {s.name: s for s in specs}
        shared = {"tool_timeout": tool_timeout, "sandbox": sandbox}
        self._tool_timeout = tool_timeout
        defaults = dict(env_kwargs or {})
        self.sources: dict[str, TaskSource] = {}
        for name, spec in self.specs.items():
            if spec.train_file or spec.heldout_file:
                try:
                    self.sources[name] = FileTaskSource(
                        train=spec.train_file, heldout=spec.heldout_file
                    )
                except ValueError as exc:
                    raise ValueError(f"tasks source {name!r}: {exc}") from None
                continue
            registered = env_tasks(spec.tasks_from or spec.env)
            if registered is None:
                raise ValueError(
                    f"tasks source {name!r}: environment {spec.tasks_from or spec.env!r} "
                    "registers no task source; give tasks[].train_file / heldout_file (JSONL or "
                    "parquet), or tasks[].tasks_from (an environment whose tasks to use)"
                )
            self.sources[name] = registered
        # Each source's factory keywords, resolved and checked once (not per episode).
        self._kwargs: dict[str, dict[str, Any]] = {}
        for name, spec in self.specs.items():
            if self.sources[name].num_tasks("train") < 1:
                raise ValueError(f"tasks source {name!r} has no train tasks (give train_file)")
            kwargs = {**(defaults if spec.env == env_name else {}), **spec.env_kwargs}
            for key, value in offered_keywords(spec.env, shared).items():
                kwargs.setdefault(key, value)
            self._kwargs[name] = kwargs
            try:
                factory = get_env_factory(spec.env)
            except ValueError:  # not registered: reported where its environments are made
                continue
            # Name the key the user set: env.kwargs when this is the run's one
            # environment, else this source's tasks[].env_kwargs. (A factory without a
            # signature is checked when it is called.)
            own = {k: v for k, v in kwargs.items() if k not in shared}
            where = (
                f"tasks source {name!r}: tasks[].env_kwargs"
                if spec.env_kwargs or spec.env != env_name
                else "env.kwargs"
            )
            problem = keyword_problem(spec.env, factory, own, where=where)
            problem = problem or keyword_problem(spec.env, factory, kwargs, where=where)
            if problem:
                raise ValueError(problem)

    def env_kwargs(self, name: str) -> dict[str, Any]:
        """The keyword arguments source ``name``'s environment is built with."""
        return dict(self._kwargs[name])

    def make_env(self, task: TaskLike) -> Environment:
        """The environment for ``task``, by its ``task_name`` (the only source's when
        there is one source)."""
        key = task_key(task)
        name = key.name
        if name not in self.specs:
            if len(self.specs) != 1:
                raise ValueError(
                    f"task {key.id!r} names no task source of this run "
                    f"(task_name={name!r}; sources: {', '.join(self.specs)})"
                )
            name = next(iter(self.specs))
        env = make_env(self.specs[name].env, **self.env_kwargs(name))
        if (
            self._tool_timeout is not None
            and isinstance(env, ToolEnvironment)
            and "tool_timeout" not in self._kwargs[name]
        ):  # env.tool_timeout_s reaches a ToolEnvironment whose __init__ does not take it
            env.tool_timeout = self._tool_timeout
        return env

    def train_stream(self, seed: int) -> TaskMixture:
        """The mixed, checkpointable train stream: each source by its weight."""
        return TaskMixture(
            {
                name: task_iterator(self.sources[name], seed=seed + spec.seed_offset)
                for name, spec in self.specs.items()
            },
            {name: spec.weight for name, spec in self.specs.items()},
        )

    def heldout(self, n: int, seed: int) -> dict[str, list[Any]]:
        """Up to ``n`` held-out tasks of each source that has some, tagged with its name."""
        return {
            name: [_tagged(t, name) for t in heldout_tasks(self.sources[name], n, seed=seed)]
            for name in self.specs
            if self.sources[name].num_tasks("heldout") > 0
        }

    def demo_sources(self) -> dict[str, DemoSource]:
        """The sources with demonstrations, with their environments' tool schemas."""
        out = {}
        for name, spec in self.specs.items():
            source = self.sources[name]
            if source.has_demonstrations:
                tools = make_env(spec.env, **self.env_kwargs(name)).tool_schemas()
                out[name] = DemoSource(source, tools, spec.weight)
        return out


def _tagged(task: Any, name: str) -> Any:
    if dataclasses.is_dataclass(task) and hasattr(task, "task_name"):
        return dataclasses.replace(task, task_name=name)
    return task
