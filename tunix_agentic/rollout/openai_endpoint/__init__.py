"""The node's OpenAI-compatible endpoint, which records every call token for token so an
agent written anywhere can be trained: the routes (:mod:`~.api`), the request schema and
its checks (:mod:`~.schema`), rendering a conversation with the model's chat template
(:mod:`~.prompt`), the reply and its stream (:mod:`~.reply`), the Responses API subset
(:mod:`~.responses`) and the recorded episodes (:mod:`~.episodes`). ``serve-rollout``
mounts it beside the node's group routes (:mod:`tunix_agentic.rollout.service.node_http`).
Nothing here imports JAX."""
