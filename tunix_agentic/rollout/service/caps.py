"""What a rollout node accepts at most: queued groups, inline task bytes, log bytes.

A request past a cap raises :class:`TooMany` (answered 429) or :class:`TooLarge`
(answered 413) naming the cap and the flag that sets it; the HTTP layer
(:mod:`~tunix_agentic.rollout.service.node_http`) alone maps them to status codes.
Open OpenAI episodes per client are capped by
:class:`~tunix_agentic.rollout.openai_endpoint.store.EpisodeLimits`. No JAX here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any


class CapExceeded(Exception):
    """A request over one of the node's caps; ``cap`` names it."""

    def __init__(self, message: str, cap: str):
        super().__init__(message)
        self.cap = cap


class TooMany(CapExceeded):
    """Too many of something at once (429): the client may try again later."""


class TooLarge(CapExceeded):
    """This request is too large (413): sending it again will not help."""


@dataclasses.dataclass(frozen=True)
class NodeCaps:
    """``max_queued``: groups waiting for a slot (``--max-queued``); ``max_task_bytes``: a
    group's inline task as JSON (``--max-task-kb``; a ``task_ref`` is never large);
    ``max_log_bytes``: the write-ahead log, past which new groups are refused
    (``--max-log-mb``; 0: no cap); ``max_claims_per_client``: external members one client
    holds claimed at once (``--max-claims``)."""

    max_queued: int = 1024
    max_task_bytes: int = 1 << 20
    max_log_bytes: int = 16 << 30
    max_claims_per_client: int = 256

    def __post_init__(self):
        for name in ("max_queued", "max_task_bytes", "max_claims_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_log_bytes < 0:
            raise ValueError(f"max_log_bytes must be >= 0, got {self.max_log_bytes}")

    def check_submit(self, body: dict[str, Any], queued: int, log_path: Path) -> None:
        """Raise the cap a new group (its canonical ``body``) would break, if any."""
        task = body.get("task")
        if task is not None:
            size = len(json.dumps(task, separators=(",", ":")))
            if size > self.max_task_bytes:
                raise TooLarge(
                    f"task: {size} bytes of inline task, over the node's cap of "
                    f"{self.max_task_bytes} (--max-task-kb); send a task_ref instead",
                    "max_task_bytes",
                )
        if queued >= self.max_queued:
            raise TooMany(
                f"{queued} groups are queued on this node, its cap (--max-queued); "
                "submit again once some have started",
                "max_queued",
            )
        if self.max_log_bytes:
            try:
                size = os.path.getsize(log_path)
            except OSError:
                size = 0
            if size >= self.max_log_bytes:
                raise TooMany(
                    f"the node's log {log_path} holds {size} bytes, its cap of "
                    f"{self.max_log_bytes} (--max-log-mb): no new group is accepted; "
                    "serve from a fresh --state-dir or raise the cap",
                    "max_log_bytes",
                )
