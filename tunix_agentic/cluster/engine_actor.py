"""An engine server as a Ray actor: ``serve-engine`` in the actor's process, on the
accelerator resources the run asks for (``rollout.ray.engine_resources``).

:class:`EngineActor` builds the run's engine from its config as ``serve-engine`` does
(:func:`~tunix_agentic.export.engine_from_config`: the model at its initial weights) and
serves it with :func:`~tunix_agentic.serving.engine_server.start_server` on its machine's
address, guarded by the run's API key, loading weights only from the run's
``rollout.service.weights_dir``.

**How the weights arrive.** Through that shared directory, as they reach engine servers
started by hand: the trainer's engine pool writes each policy version there once and
asks every engine to load it (``/update_weights_from_disk``), and a rollout node pushes
the published version to an engine that came back without it. Ray's object store was
the other way; the directory was kept because a restarted engine must find the current
weights without the driver, the write happens once however many engines read it, and
the path (and its guard against loading from anywhere else) is the one the hand-started
servers already use and test. The directory must be one every machine of the cluster
sees at the same path (a shared volume on Kubernetes).

Ray runs ``__init__`` again on a restart: the engine comes back at its initial weights,
on the same port when that is free (so the clients' URLs still hold), and the rollout
nodes hand it the published version before they use it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunix_agentic.cluster.node_actor import load_run_config
from tunix_agentic.cluster.server_thread import ServerActor, ServerThread


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What one engine actor is started with (the same on every restart): ``name``
    (``<run>/engine/<i>``), the run ``config`` as a plain dict, the run's ``api_key``,
    the ``weights_dir`` it may load from, and where its state dir lives."""

    name: str
    config: dict[str, Any]
    api_key: str
    weights_dir: str
    state_root: str | None = None


class EngineActor(ServerActor):
    """A JAX engine behind ``serve-engine``'s HTTP API in a Ray actor's process."""

    def _thread(self, host: str, port: int) -> ServerThread:
        from tunix_agentic.export import engine_from_config
        from tunix_agentic.serving.engine_server import start_server

        spec: EngineSpec = self.spec
        engine, info = engine_from_config(load_run_config(spec.config))

        async def serve(port: int):
            runner, real_port = await start_server(
                engine,
                host=host,
                port=port,
                model_info=info,
                api_key=spec.api_key,
                weight_dirs=[spec.weights_dir],
            )
            return real_port, runner.cleanup

        return ServerThread(f"engine {spec.name}", serve, port, teardown=engine.close)
