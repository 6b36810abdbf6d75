"""The node's OpenAI-compatible endpoint, which records every call token for token so an
agent written anywhere can be trained, laid out as SGLang's ``entrypoints/openai``: the
request and reply models (:mod:`~.protocol`), one handler per route (``serving_*``) over
the shared call path (:mod:`~.call_path`, :mod:`~.serving_base`), the route table
(:mod:`~.api`), rendering and replies (:mod:`~.prompt`, :mod:`~.reply`, :mod:`~.live`), and
the episodes: their store (:mod:`~.store`), what they recorded (:mod:`~.recording`) and
the groups a node makes of them (:mod:`~.offers`). ``serve-rollout`` mounts it beside the
node's group routes (:mod:`tunix_agentic.rollout.service.node_http`). Nothing here imports
JAX."""
