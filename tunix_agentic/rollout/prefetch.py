"""INIT ahead of admission (``rollout.prefetch_groups``): groups whose environments are
made and reset before the staleness gate lets them run.

Creating and resetting a sandbox involves no policy, so during continuous production
the orchestrator keeps up to ``prefetch_groups`` groups INIT'ed ahead, in task order;
an admitted group then starts RUN at once. :class:`Prefetch` holds them, hands them out
oldest first and closes the environments of those never run.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

from tunix_agentic.rollout.group import InitResult
from tunix_agentic.rollout.group_runner import PrefetchingRunner
from tunix_agentic.rollout.task_stream import TaskStream
from tunix_agentic.trajectory import TaskLike


@dataclasses.dataclass(frozen=True)
class PreparedGroup:
    """A group INIT'ed ahead of admission: group ``index`` of the task stream, on ``task``."""

    index: int
    task: TaskLike
    members: list[InitResult]


class Prefetch:
    """Up to ``size`` groups of ``stream``'s next tasks, INIT'ed by ``runner``, in task
    order (each a task resolving to a :class:`PreparedGroup`)."""

    def __init__(self, runner: PrefetchingRunner, stream: TaskStream, size: int, group_size: int):
        self.runner, self.stream, self.size, self.group_size = runner, stream, size, group_size
        self._prepared: collections.deque[asyncio.Task[PreparedGroup]] = collections.deque()

    def __len__(self) -> int:
        return len(self._prepared)

    def fill(self) -> None:
        """Draw tasks and start their INIT until ``size`` groups are held."""
        while len(self._prepared) < self.size:
            index, task = self.stream.next()
            self._prepared.append(
                asyncio.get_running_loop().create_task(self._prepare(index, task))
            )

    async def take(self) -> PreparedGroup:
        """The oldest group, once its INIT is done (task order, whatever finished first)."""
        prepared = await self._prepared[0]
        self._prepared.popleft()
        return prepared

    def ready(self) -> list[list[InitResult]]:
        """The INIT results of groups ready to run, in task order, one list per group
        (still-initialising ones left out)."""
        return [t.result().members for t in self._prepared if t.done() and not t.cancelled()]

    async def discard(self) -> None:
        """Close every environment INIT'ed ahead and never run."""
        prepared, self._prepared = list(self._prepared), collections.deque()
        for t in prepared:
            t.cancel()  # still initialising: the runner closes what it made (init_group)
        for result in await asyncio.gather(*prepared, return_exceptions=True):
            if not isinstance(result, BaseException):
                await self.runner.close_members(result.members)

    async def _prepare(self, index: int, task: TaskLike) -> PreparedGroup:
        """INIT for every member of a group (see
        :meth:`PrefetchingRunner.init_group
        <tunix_agentic.rollout.group_runner.PrefetchingRunner.init_group>`)."""
        return PreparedGroup(index, task, await self.runner.init_group(task, self.group_size))
