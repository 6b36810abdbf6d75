"""The run's parts placed on a Ray cluster (``rollout.ray``): Ray starts and restarts them.

A package of its own, beside ``rollout/`` and ``serving/``, because it places processes
of several kinds on machines (rollout nodes and engine servers; environment servers
would be the same pattern) and is the only code that imports Ray. What runs inside the
actors is the existing code (``serve-rollout``'s node, ``serve-engine``'s server), and
the trainer reaches them by URL through the existing clients: Ray adds placement, restarts, names and
cleanup, nothing to the protocol.

:mod:`.node_actor` is the rollout node as a Ray actor (JAX-free: it runs on CPU
machines), :mod:`.engine_actor` the engine server (JAX: accelerator machines) and
:mod:`.vllm_actor` a real vLLM server behind a guard (``engine.backend: vllm``), all on
:mod:`.server_thread`; :mod:`.fleet` starts a run's actors from the driver, follows their
restarts and stops them; :mod:`.connect` holds the trainer's hooks. Ray itself is an optional extra
(``pip install -e .[ray]``) imported only when ``rollout.ray.nodes`` is set.
"""

from tunix_agentic.lazy import lazy_exports

_API = {
    "ClusterTooSmall": "tunix_agentic.cluster.errors",
    "RayUnavailable": "tunix_agentic.cluster.errors",
    "Placement": "tunix_agentic.cluster.server_thread",
    "NodeSpec": "tunix_agentic.cluster.node_actor",
    "RolloutNodeActor": "tunix_agentic.cluster.node_actor",
    "EngineSpec": "tunix_agentic.cluster.engine_actor",
    "EngineActor": "tunix_agentic.cluster.engine_actor",
    "RayRolloutNodes": "tunix_agentic.cluster.fleet",
    "RayEngines": "tunix_agentic.cluster.fleet",
    "RayVLLMEngines": "tunix_agentic.cluster.fleet",
    "VLLMActor": "tunix_agentic.cluster.vllm_actor",
    "NAMESPACE": "tunix_agentic.cluster.errors",
    "connect_ray_nodes": "tunix_agentic.cluster.connect",
    "start_ray_engines": "tunix_agentic.cluster.connect",
}
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
