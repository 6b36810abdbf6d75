"""What an engine is configured with: memory and batching limits, and the shape buckets
its prefill and decode compile for (shared by the engine and its scheduler thread)."""

from __future__ import annotations

import dataclasses

from tunix_agentic.mesh_config import MeshConfig


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Memory and batching limits of one engine."""

    max_slots: int = 32
    max_seq_len: int = 256
    decode_steps: int = 8
    min_prefill_len: int = 16
    session_reuse: bool = True
    # Reuse the KV of the longest prompt prefix any slot holds (a GRPO group's samples, a
    # shared system prompt): copied on device, only the rest is prefilled. Greedy outputs
    # are the same with it off; off also keeps a freed slot's cache from being reused.
    prefix_cache: bool = True
    reuse_kv_across_versions: bool = False
    # Queue the next decode chunk before collecting the last one, so host work overlaps the
    # device's (a chunk queued ahead whose requests all ended stops on device at once).
    overlap: bool = True
    # Trainer: compile every prefill shape and the decode chunk on a second thread at start
    # (beside the SFT warm start) instead of when each shape is first met mid-rollout.
    warmup: bool = True
    seed: int = 0
    # Devices the engine serves from (tunix_agentic.sharding); the default is one device.
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        for name in ("max_slots", "max_seq_len", "decode_steps", "min_prefill_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("session_reuse", "prefix_cache", "reuse_kv_across_versions", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"engine.{name} must be true or false, got {getattr(self, name)!r}"
                )

    def length_buckets(self) -> list[int]:
        out, n = [], self.min_prefill_len
        while n < self.max_seq_len:
            out.append(n)
            n *= 2
        return out + [self.max_seq_len]

    def row_buckets(self) -> list[int]:
        out, n = [], 1
        while n < self.max_slots:
            out.append(n)
            n *= 2
        return out + [self.max_slots]


def bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``n``."""
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
