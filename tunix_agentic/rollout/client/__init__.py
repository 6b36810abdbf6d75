"""The trainer's side of rollout as a service: the client of one node
(:mod:`~tunix_agentic.rollout.client.node_client`), the trainer's live view of all of them
(:mod:`~tunix_agentic.rollout.client.node_pool`), the group runner that places groups on
them (:mod:`~tunix_agentic.rollout.client.runner`) and the run's connection to them
(:mod:`~tunix_agentic.rollout.client.connect`). The nodes themselves are
:mod:`tunix_agentic.rollout.service`; the JSON both sides speak is
:mod:`tunix_agentic.rollout.wire`. Nothing here imports JAX."""
