"""Rollout as a service: rollout nodes run groups submitted over HTTP (``serve-rollout``).

:mod:`~tunix_agentic.rollout.service.node` is the node (groups run by the
:class:`~tunix_agentic.rollout.episode.EpisodeRunner`), :mod:`.node_http` its HTTP API
(``serve-rollout``), :mod:`.engines` its engines by URL;
:mod:`~tunix_agentic.rollout.service.wal` its write-ahead log of finished groups. The
trainer's side (the client of a node, the group runner) is
:mod:`tunix_agentic.rollout.client`; the node's OpenAI endpoint is
:mod:`tunix_agentic.rollout.openai_endpoint`; the JSON they all speak (tasks,
trajectories, groups and group requests) is :mod:`tunix_agentic.rollout.wire`. Nothing here
imports JAX: a rollout node runs on CPU machines.
"""

from tunix_agentic.lazy import lazy_exports

_API = {
    "GroupRequest": "tunix_agentic.rollout.wire",
    "group_from_json": "tunix_agentic.rollout.wire",
    "group_to_json": "tunix_agentic.rollout.wire",
    "trajectory_from_json": "tunix_agentic.rollout.wire",
    "trajectory_to_json": "tunix_agentic.rollout.wire",
    "NodeClient": "tunix_agentic.rollout.client.node_client",
    "NodeUnavailable": "tunix_agentic.rollout.client.node_client",
    "RolloutNode": "tunix_agentic.rollout.service.node",
    "EngineSet": "tunix_agentic.rollout.service.engines",
    "build_node_app": "tunix_agentic.rollout.service.node_http",
    "start_node_server": "tunix_agentic.rollout.service.node_http",
    "GroupLog": "tunix_agentic.rollout.service.wal",
}
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
