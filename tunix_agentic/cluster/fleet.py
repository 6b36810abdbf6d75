"""A run's rollout nodes and engines on Ray, from the driver (the trainer): start, follow,
stop.

:class:`RayRolloutNodes` connects to the cluster (``rollout.ray.address``, namespace
:data:`~tunix_agentic.cluster.errors.NAMESPACE`), checks that the cluster has the
resources ``rollout.ray`` asks for (an error naming them at once, not a silent wait),
starts ``rollout.ray.nodes`` :class:`~tunix_agentic.cluster.node_actor.RolloutNodeActor`
actors named ``<run>/rollout/<i>``, spread over the Ray nodes, with Ray's
``max_restarts``, and waits (up to ``rollout.ray.start_timeout_s``) until each listens.
Their URLs feed the service client the trainer already has
(:class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner`).

While the run goes on, :meth:`RayRolloutNodes.follow` asks each actor where it is every
few seconds: a restart by Ray is printed, and a node that came back at another URL
(restarted on another machine, or its port taken) is re-pointed in the runner, whose
health watch then takes it back. :meth:`RayRolloutNodes.close` stops the nodes and kills
the actors. The actors are the driver's (not detached): should the trainer's process die
without closing, Ray ends them with it. Another run's actors are never touched: names
carry this run's own id. :class:`RayEngines` does the same for the run's engine servers
(``rollout.ray.engines``, actors named ``<run>/engine/<i>``), started before the nodes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from tunix_agentic.cluster.engine_actor import EngineActor, EngineSpec
from tunix_agentic.cluster.errors import NAMESPACE, ClusterTooSmall, require_ray
from tunix_agentic.cluster.node_actor import NodeSpec, RolloutNodeActor
from tunix_agentic.cluster.server_thread import Placement
from tunix_agentic.cluster.vllm_actor import VLLMActor
from tunix_agentic.rollout.config import RayConfig

_log = logging.getLogger(__name__)

_STOP_WAIT_S = 20.0


def run_name(base: str) -> str:
    """``base`` (the run dir's name) and a fresh id: two runs on one cluster never share
    an actor name, even from run dirs of the same name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in base) or "run"
    return f"{safe}-{uuid.uuid4().hex[:8]}"


def capacity(nodes: list[dict[str, Any]], options: dict[str, Any]) -> int:
    """How many actors asking for ``options`` (Ray's ``num_cpus`` / ``num_gpus`` /
    ``memory`` / ``resources``) the alive ``nodes`` (``ray.nodes()``) hold at most."""
    ask = dict(options.get("resources", {}))
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
        if options.get(key):
            ask[name] = options[key]
    total = 0
    for node in nodes:
        if not node.get("Alive", node.get("alive", False)):
            continue
        have = node.get("Resources", {})
        fits = [
            math.floor(have.get(name, 0) / amount + 1e-9)
            for name, amount in ask.items()
            if amount > 0
        ]
        total += min(fits) if fits else 1_000_000
    return total


class RayActors:
    """One run's servers of one role as Ray actors: start, follow, stop. Subclasses name
    the role, the actor and spec classes and the config fields that say how many and what
    each asks of Ray. ``config``: the run config as a plain dict (what each actor reads);
    ``api_key``: the key every actor asks for; ``spec_fields``: the rest of each spec
    (``admin_key`` for nodes, ``weights_dir`` for engines). ``log``: where placement lines
    go (the trainer's console)."""

    role = ""
    noun = ""  # what one actor is, for messages ("rollout nodes")
    actor_class: Any = None
    spec_class: Any = None
    count_field = ""  # rollout.ray's field: how many
    resources_field = ""  # rollout.ray's field: what each asks for

    def __init__(
        self,
        ray_config: RayConfig,
        *,
        name: str,
        config: dict[str, Any],
        api_key: str,
        log: Callable[[str], None] | None = None,
        **spec_fields: Any,
    ):
        self.ray_config = ray_config
        self.name = name
        self.specs = [
            self.spec_class(
                name=f"{name}/{self.role}/{i}",
                config=config,
                api_key=api_key,
                state_root=ray_config.state_root,
                **spec_fields,
            )
            for i in range(getattr(ray_config, self.count_field))
        ]
        self.api_key = api_key
        self.admin_key = spec_fields.get("admin_key")
        self._print = log or (lambda msg: None)
        self.actors: list[Any] = []
        self.placements: list[Placement] = []
        self._own_ray = False
        self._ray: Any = None
        self._follow: asyncio.Task | None = None
        self._clients: list[Any] = []  # re-pointed nodes' clients, closed with the fleet

    def _say(self, msg: str) -> None:
        _log.info("%s", msg)
        self._print(msg)

    def _asked_resources(self) -> dict[str, float]:
        return self.ray_config.resources(self.resources_field)

    def _actor_options(self) -> dict[str, Any]:
        return self.ray_config.actor_options(self.resources_field)

    # ------------------------------------------------------------- start
    def start(self) -> list[Placement]:
        """Connect, check the cluster, start the actors and wait until each listens
        (blocking: call it from a thread). Their placements, in order.
        :class:`ClusterTooSmall` naming the resources when they cannot all be placed."""
        ray = self._ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=self.ray_config.address, namespace=NAMESPACE, log_to_driver=True)
            self._own_ray = True
        options = self._actor_options()
        fits = capacity(ray.nodes(), options)
        if fits < len(self.specs):
            raise ClusterTooSmall(
                f"rollout.ray asks for {len(self.specs)} {self.noun} of {self._asked()} each "
                f"(rollout.ray.{self.resources_field}), and the cluster's nodes hold {fits}: "
                f"{_cluster_text(ray.nodes())}"
            )
        remote = ray.remote(self.actor_class)
        for spec in self.specs:
            actor = remote.options(
                name=spec.name,
                namespace=NAMESPACE,
                max_restarts=self.ray_config.max_restarts,
                scheduling_strategy="SPREAD",
                **options,
            ).remote(spec)
            self.actors.append(actor)
        refs = [actor.placement.remote() for actor in self.actors]
        ready, pending = ray.wait(
            refs, num_returns=len(refs), timeout=self.ray_config.start_timeout_s
        )
        if pending:
            placed = len(ready)
            raise ClusterTooSmall(
                f"{len(pending)} of {len(refs)} {self.noun} ({self._asked()} each) were not "
                f"placed and listening within rollout.ray.start_timeout_s="
                f"{self.ray_config.start_timeout_s:g} ({placed} were); free on the cluster now: "
                f"{_resources_text(ray.available_resources())}"
            )
        self.placements = ray.get(refs)  # an actor that failed to start raises its error here
        for placement in self.placements:
            self._say(f"{self.role}: {placement.describe()}")
        return self.placements

    def driver_ip(self) -> str:
        """This process's address as Ray sees it (where nodes on other machines reach it)."""
        return self._ray.util.get_node_ip_address()

    def _asked(self) -> str:
        asked = self._asked_resources()
        return "{" + ", ".join(f"{k}: {v:g}" for k, v in asked.items()) + "}"

    # ------------------------------------------------------------ follow
    def follow(self, runner: Any, every_s: float = 2.0) -> None:
        """Watch the actors on the running loop until :meth:`close`: print each restart,
        and re-point ``runner``'s node (its ``nodes``: url and client) when an actor came
        back at another URL."""
        self._follow = asyncio.get_running_loop().create_task(self._watch(runner, every_s))

    async def _watch(self, runner: Any, every_s: float) -> None:
        asking: dict[int, concurrent.futures.Future] = {}
        while True:
            await asyncio.sleep(every_s)
            for i, actor in enumerate(self.actors):
                fut = asking.get(i)
                if fut is None:  # at most one question in flight per actor
                    asking[i] = actor.placement.remote().future()
                    continue
                if not fut.done():
                    continue
                del asking[i]
                try:
                    now = fut.result()
                except Exception as exc:  # dead for good (past max_restarts), or restarting
                    _log.debug(
                        "rollout node %s did not say where it is: %s", self.specs[i].name, exc
                    )
                    continue
                self._moved(runner, i, now)

    def _moved(self, runner: Any, i: int, now: Placement) -> None:
        before = self.placements[i]
        if now.pid == before.pid and now.url == before.url:
            return
        self.placements[i] = now
        self._say(f"{self.role}: {now.describe()}")
        if now.url != before.url:
            self._repoint(runner, before.url, now.url)

    def _repoint(self, runner: Any, old: str, new: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------- close
    async def close(self) -> None:
        """Stop following, close every node (its state dir removed), kill the actors (no
        restart), close the clients made here; disconnect from Ray if this connected."""
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow
        for client in self._clients:
            await client.close()
        if self.actors:
            await asyncio.to_thread(self._kill_actors)
        if self._own_ray and self._ray is not None:
            await asyncio.to_thread(self._ray.shutdown)
            self._own_ray = False

    def _kill_actors(self) -> None:
        ray = self._ray
        deadline = time.monotonic() + _STOP_WAIT_S
        for actor in self.actors:  # one at a time: each removes the directories it empties
            left = deadline - time.monotonic()
            if left > 0:
                with contextlib.suppress(Exception):  # a node that is down cannot clean up
                    ray.wait([actor.stop.remote()], timeout=left)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.actors = []


class RayRolloutNodes(RayActors):
    """The rollout nodes of one run (``rollout.ray.nodes``), with ``admin_key`` for their
    operator routes. A node that came back at another URL is re-pointed in the runner
    given to :meth:`follow`."""

    role = "rollout"
    noun = "rollout nodes"
    actor_class = RolloutNodeActor
    spec_class = NodeSpec
    count_field = "nodes"
    resources_field = "node_resources"

    def _repoint(self, runner: Any, old: str, new: str) -> None:
        from tunix_agentic.rollout.client.node_client import NodeClient

        for node in getattr(runner, "nodes", []):
            if node.url == old:
                client = NodeClient(new, api_key=self.api_key, admin_key=self.admin_key)
                self._clients.append(client)
                node.url, node.client = new, client
                self._say(f"rollout node at {old} is now at {new}")


class RayEngines(RayActors):
    """The engine servers of one run (``rollout.ray.engines``), each on
    ``rollout.ray.engine_resources``, loading the policy's versions from ``weights_dir``
    (see :mod:`.engine_actor`). An engine Ray restarts on its machine comes back on its
    port; one that comes back at another URL is followed: each of :attr:`moved_to`
    (``callback(old_url, new_url)``: the trainer's engine pool, the rollout nodes' runner)
    is told."""

    role = "engine"
    noun = "engines"
    actor_class = EngineActor
    spec_class = EngineSpec
    count_field = "engines"
    resources_field = "engine_resources"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.moved_to: list[Callable[[str, str], Any]] = []

    @property
    def urls(self) -> tuple[str, ...]:
        """Where the engines are now (after :meth:`start`)."""
        return tuple(p.url for p in self.placements)

    def _repoint(self, runner: Any, old: str, new: str) -> None:
        self._say(f"engine at {old} is now at {new}")
        for callback in self.moved_to:
            try:
                callback(old, new)
            except Exception:  # one follower failing must not stop the others
                _log.exception("telling %r that engine %s moved to %s failed", callback, old, new)


class RayVLLMEngines(RayEngines):
    """The run's engines as real vLLM servers (``engine.backend: vllm``), each behind its
    guard (see :mod:`.vllm_actor`); started, followed and stopped as :class:`RayEngines`."""

    noun = "vLLM engines"
    actor_class = VLLMActor


def wait_gone(names: list[str], timeout_s: float = 30.0) -> list[str]:
    """The ``names`` still alive in :data:`NAMESPACE` after waiting up to ``timeout_s`` for
    them to go (a killed actor takes a moment to be marked dead)."""
    ray = require_ray()
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE
        }
        left = [n for n in names if n in alive]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _resources_text(resources: dict[str, float]) -> str:
    shown = {
        k: v
        for k, v in sorted(resources.items())
        if not k.startswith("node:") and "_group_" not in k
    }
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def _cluster_text(nodes: list[dict[str, Any]]) -> str:
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    return (
        "; ".join(
            f"node {n.get('NodeID', '?')[:12]} {_resources_text(n.get('Resources', {}))}"
            for n in alive
        )
        or "no alive nodes"
    )
