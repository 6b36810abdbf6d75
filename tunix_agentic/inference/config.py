"""What an engine is configured with: memory and batching limits, and the shape buckets
its prefill and decode compile for (shared by the engine and its scheduler thread)."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args
from urllib.parse import urlsplit

from tunix_agentic.mesh_config import MeshConfig

# The closed choices of ``engine:`` settings (each one described at its EngineConfig field).
KVLayout = Literal["dense", "paged"]
DecodeWindow = Literal["bucketed", "full"]
EngineBackend = Literal["jax", "sglang", "vllm"]
KV_LAYOUTS: tuple[KVLayout, ...] = get_args(KVLayout)
DECODE_WINDOWS: tuple[DecodeWindow, ...] = get_args(DecodeWindow)
ENGINE_BACKENDS: tuple[EngineBackend, ...] = get_args(EngineBackend)


def check_urls(urls: tuple[str, ...], key: str) -> None:
    """ValueError naming ``key[i]`` unless every one of ``urls`` is an http(s) URL with a
    host, each named once."""
    for i, url in enumerate(urls):
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{key}[{i}] must be an http(s)://HOST:PORT URL, got {url!r}")
    if len(set(urls)) != len(urls):
        raise ValueError(f"{key} names a URL twice: {list(urls)}")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Memory and batching limits of one engine."""

    # Requests decoded at once (KV cache slots); more wait in the queue. Prefill rows are
    # padded to powers of two up to it.
    max_slots: int = 32
    # Tokens one slot holds, prompt and generated: a prompt of this many or more is refused,
    # generation stops at it. "dense" reserves this much KV per slot.
    max_seq_len: int = 256
    # Decode steps in one jitted chunk; requests are admitted and tokens collected between
    # chunks (more: less host work per token, later admission).
    decode_steps: int = 8
    # The smallest prefill length bucket, in tokens: the tokens to prefill are padded to it
    # times a power of two (capped at max_seq_len), one compiled prefill per bucket.
    min_prefill_len: int = 16
    # Park a finished request's slot with its KV under its session id; the session's next
    # prompt that extends it prefills only the new tokens. Evicted LRU when slots run out.
    session_reuse: bool = True
    # Reuse the KV of the longest prompt prefix any slot holds (a GRPO group's samples, a
    # shared system prompt): copied on device, only the rest is prefilled. Greedy outputs
    # are the same with it off; off also keeps a freed slot's cache from being reused.
    prefix_cache: bool = True
    # Keep parked and prefix KV made by older weights after a weight update; false: it is
    # dropped, and the new weights recompute it.
    reuse_kv_across_versions: bool = False
    # Queue the next decode chunk before collecting the last one, so host work overlaps the
    # device's (a chunk queued ahead whose requests all ended stops on device at once).
    overlap: bool = True
    # Compile every prefill shape and the decode chunk on a background thread as the engine
    # starts (JaxEngine.start_warmup), instead of when each shape is first met mid-rollout.
    # true: every engine built with it (a JaxEngine, serve-engine, eval, the trainer's); false:
    # none; unset (None): the trainer's engines warm up (beside the SFT warm start), no other.
    warmup: bool | None = None
    # A request without a seed of its own samples with crc32("{seed}/{request id}"); an
    # episode's requests carry theirs (rollout.seed).
    seed: int = 0
    # Devices the engine serves from (tunix_agentic.sharding); the default is one device.
    mesh: MeshConfig = MeshConfig()
    # KV layout. "dense": every slot reserves max_seq_len tokens of KV. "paged": one pool of
    # kv_blocks blocks of kv_block_size tokens per layer; a slot holds only the blocks its
    # tokens need, shared prompt prefixes share whole blocks, and a request waits for
    # blocks to be free (inference/paged.py). kv_blocks 0: half of what dense reserves.
    kv_layout: KVLayout = "dense"
    kv_block_size: int = 16  # "paged": tokens per block, a power of two dividing max_seq_len
    # "paged": blocks in each layer's pool, at least one max_seq_len sequence; 0: half of
    # what dense reserves (max_slots x max_seq_len / 2 tokens).
    kv_blocks: int = 0
    # How much of the cache a decode chunk attends over. "bucketed": the smallest of
    # window_buckets() that holds every live slot's position at the chunk's end (one compiled
    # decode per bucket); "full": all max_seq_len positions every step (one shape).
    decode_window: DecodeWindow = "bucketed"
    # Which engine samples: "jax" (ours: in this process, or the serve-engine servers of
    # rollout.service.engine_urls / rollout.ray.engines), or servers at ``urls`` spoken to
    # over HTTP: "sglang" (SGLang's native API: SGLang, serve-engine) or "vllm" (a real vLLM
    # started by `tunix-agentic serve-vllm`; serving/vllm_client.py). The fields above are
    # the JAX engine's; a server has its own.
    backend: EngineBackend = "jax"
    # The servers of backend sglang or vllm (http(s)://HOST:PORT) when rollout runs in this
    # process, spread by load (a session stays on one). Rollout nodes use
    # rollout.service.engine_urls instead.
    urls: tuple[str, ...] = ()

    def __post_init__(self):
        if self.backend not in ENGINE_BACKENDS:
            raise ValueError(
                f"engine.backend must be 'jax', 'sglang' or 'vllm', got {self.backend!r}"
            )
        urls = (self.urls,) if isinstance(self.urls, str) else tuple(self.urls or ())
        object.__setattr__(self, "urls", urls)
        check_urls(urls, "engine.urls")
        if urls and self.backend == "jax":
            raise ValueError(
                "engine.urls names servers but engine.backend is 'jax' (in process): "
                "set engine.backend to 'sglang' or 'vllm'"
            )
        for name in ("max_slots", "max_seq_len", "decode_steps", "min_prefill_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup is not None and not isinstance(self.warmup, bool):
            raise ValueError(f"engine.warmup must be true, false or unset, got {self.warmup!r}")
        for name in ("session_reuse", "prefix_cache", "reuse_kv_across_versions", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"engine.{name} must be true or false, got {getattr(self, name)!r}"
                )
        if self.decode_window not in DECODE_WINDOWS:
            raise ValueError(
                f"engine.decode_window must be 'bucketed' or 'full', got {self.decode_window!r}"
            )
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"engine.kv_layout must be 'dense' or 'paged', got {self.kv_layout!r}")
        bs = self.kv_block_size
        if not isinstance(bs, int) or bs < 1 or bs & (bs - 1):
            raise ValueError(f"engine.kv_block_size must be a power of two >= 1, got {bs!r}")
        if not isinstance(self.kv_blocks, int) or self.kv_blocks < 0:
            raise ValueError(f"engine.kv_blocks must be an integer >= 0, got {self.kv_blocks!r}")
        if self.kv_layout == "paged":
            if self.max_seq_len % bs:
                raise ValueError(
                    f"engine.max_seq_len ({self.max_seq_len}) must be a multiple of "
                    f"engine.kv_block_size ({bs}) with kv_layout 'paged'"
                )
            if self.kv_blocks and self.kv_blocks < self.blocks_per_seq:
                raise ValueError(
                    f"engine.kv_blocks ({self.kv_blocks}) must hold one max_seq_len sequence: "
                    f">= {self.blocks_per_seq} blocks of {bs} tokens"
                )

    @property
    def blocks_per_seq(self) -> int:
        """Blocks of one ``max_seq_len`` sequence (the width of a slot's block table)."""
        return -(-self.max_seq_len // self.kv_block_size)

    @property
    def num_kv_blocks(self) -> int:
        """The paged pool's size: ``kv_blocks``, or half of what dense would reserve (at
        least one max_seq_len sequence)."""
        if self.kv_blocks:
            return self.kv_blocks
        return max(self.blocks_per_seq, self.max_slots * self.blocks_per_seq // 2)

    def length_buckets(self) -> list[int]:
        out, n = [], self.min_prefill_len
        while n < self.max_seq_len:
            out.append(n)
            n *= 2
        return out + [self.max_seq_len]

    def window_buckets(self) -> list[int]:
        """The decode windows this engine compiles for (:func:`window_buckets`; paged:
        multiples of the block size; ``decode_window: full``: only ``max_seq_len``).

        Dense, the cache is stored in pieces cut at these windows
        (:func:`~tunix_agentic.models.transformer.cache_chunks`), so a window reads whole
        pieces and copies nothing."""
        if self.decode_window == "full":
            return [self.max_seq_len]
        if self.kv_layout == "paged":  # its blocks are gathered (a copy) whatever the window
            return window_buckets(self.max_seq_len, multiple=self.kv_block_size)
        return window_buckets(self.max_seq_len)

    def row_buckets(self) -> list[int]:
        out, n = [], 1
        while n < self.max_slots:
            out.append(n)
            n *= 2
        return out + [self.max_slots]


# The smallest decode window: below it the attention saved is too small to pay for a shape.
WINDOW_BASE = 64


def window_buckets(max_seq_len: int, *, multiple: int = 1, base: int = WINDOW_BASE) -> list[int]:
    """Decode window sizes up to ``max_seq_len``: ``base`` times powers of two and the
    midpoints between them (64, 96, 128, 192, 256, 384, ...), each rounded up to a
    ``multiple``, then ``max_seq_len`` itself (always the last). A window never overshoots
    what it must hold by more than half (and the cap), and a cache of length L compiles
    about 2 log2(L / base) + 1 shapes."""
    if max_seq_len < 1 or multiple < 1 or base < 1:
        raise ValueError(
            f"window_buckets needs positive sizes, got max_seq_len={max_seq_len}, "
            f"multiple={multiple}, base={base}"
        )
    out: list[int] = []
    n = base
    while True:
        for size in (n, n * 3 // 2):
            size = -(-size // multiple) * multiple
            if size >= max_seq_len:
                return out + [max_seq_len]
            if not out or size > out[-1]:
                out.append(size)
        n *= 2


def bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``n``."""
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
