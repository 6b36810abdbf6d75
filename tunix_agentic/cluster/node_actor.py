"""A rollout node as a Ray actor: ``serve-rollout``'s node and HTTP API in the actor's process.

The actor's process *is* the node: :class:`RolloutNodeActor` runs a
:class:`~tunix_agentic.rollout.service.node.RolloutNode` behind
:func:`~tunix_agentic.rollout.service.node_http.start_node_server` on an event loop of
its own thread, so a SIGKILL of the process is a node's death that Ray sees and answers
with a restart (``max_restarts``). Ray runs ``__init__`` again on a restart: the node
comes back on the same state dir (its write-ahead log: finished groups served again,
unfinished ones ``lost``) and, when the port it had is free, on the same URL, so the
trainer's health watch takes it back as it would a hand-restarted node. Placed on
another machine, it starts with an empty state dir and a new URL, which the driver
learns from :meth:`RolloutNodeActor.placement` (see :mod:`.fleet`).

Nothing here imports JAX (a node runs on CPU machines); the run config arrives as the
plain dict of :func:`~tunix_agentic.config.to_dict` and is read back as ``serve-rollout``
reads its YAML.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunix_agentic.cluster.server_thread import Placement, ServerActor, ServerThread
from tunix_agentic.config import RunConfig, from_dict, import_envs, resolve_model

NodePlacement = Placement  # where a node actor runs (the name its callers know)


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What one node actor is started with (the same on every restart).

    ``name``: ``<run>/<role>/<i>`` (its Ray actor name, and its state dir under
    ``state_root`` on whichever machine it lands). ``config``: the run config as a plain
    dict. ``api_key``: every route's key (the trainer's run key; the node listens on its
    machine's address, beyond loopback); ``admin_key``: the operator routes' key.
    """

    name: str
    config: dict[str, Any]
    api_key: str
    admin_key: str
    state_root: str | None = None
    max_groups: int | None = None


def load_run_config(data: dict[str, Any]) -> RunConfig:
    """The run config from its plain dict, as ``load_config`` reads a YAML file: checked,
    the user's environment modules imported, a Hugging Face model's shape read."""
    cfg = from_dict(RunConfig, data)
    import_envs(cfg)
    return resolve_model(cfg)


class RolloutNodeActor(ServerActor):
    """A rollout node in a Ray actor's process. Listens on its machine's address (Ray's
    node IP) on the port it had before a restart when that is free, else a free one."""

    def _thread(self, host: str, port: int) -> ServerThread:
        from tunix_agentic.rollout.service.engines import EngineSet
        from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
        from tunix_agentic.rollout.service.node_http import start_node_server

        spec: NodeSpec = self.spec
        setup = setup_from_config(load_run_config(spec.config))
        kwargs = dict(host=host, api_key=spec.api_key, admin_key=spec.admin_key)

        async def serve(port: int):
            engines = EngineSet([], api_key=spec.api_key)  # the trainer names them
            node = RolloutNode(setup, engines, self.state_dir, max_groups=spec.max_groups)
            try:
                runner, real_port = await start_node_server(node, port=port, **kwargs)
            except BaseException:
                await node.close()
                raise

            async def cleanup() -> None:
                await runner.cleanup()
                await node.close()  # its groups cancelled, its log closed

            return real_port, cleanup

        return ServerThread(f"rollout-node {spec.name}", serve, port)
