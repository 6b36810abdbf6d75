"""LoRA: train low-rank adapters on a frozen model; the engine gets them merged.

For each targeted linear kernel ``W [in, out]`` an adapter holds ``a [in, r]``
(random) and ``b [r, out]`` (zeros, so training starts at the base policy);
the policy's kernel is ``W + (alpha / r) * a @ b``. The adapters are a plain
dict of arrays, keyed by the kernel's path, so optimizers, checkpoints and
jitted steps treat them like any parameter tree. :func:`merge` returns the
full parameter tree (the base's structure, no adapter leaves): what the engine
receives on every weight sync, so rollouts never keep sampling the base policy.
:func:`attach` returns the same policy with each adapter applied beside its frozen
kernel: what the learner differentiates through.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tunix_agentic.learners.configs import ALL_LINEAR, LoRAConfig  # noqa: F401  (re-exported)
from tunix_agentic.models.transformer import LowRank


def _key(path: Any) -> str:
    """An adapter's key: its kernel's path, e.g. ``layers/0/attn/q_proj/kernel``."""
    return "/".join(map(str, path))


def _targets(params: Any, cfg: LoRAConfig) -> dict[str, tuple[Any, ...]]:
    """Adapter key -> path of each targeted kernel in ``params`` (an nnx State)."""
    out = {}
    for path, _ in nnx.to_flat_state(params):
        if len(path) >= 2 and path[-1] == "kernel" and path[-2] in cfg.targets:
            out[_key(path)] = tuple(path)
    if not out:
        raise ValueError(f"no linear kernels named {cfg.targets} in the model")
    return out


def init_adapters(params: Any, cfg: LoRAConfig, key: jax.Array) -> dict[str, dict[str, jax.Array]]:
    """Fresh adapters for every targeted kernel of ``params``; ``b`` is zero."""
    flat = dict(nnx.to_flat_state(params))
    adapters = {}
    for i, (name, path) in enumerate(sorted(_targets(params, cfg).items())):
        kernel = flat[path]
        value = kernel.get_value() if hasattr(kernel, "get_value") else kernel.value
        fan_in, fan_out = value.shape
        a = jax.random.normal(jax.random.fold_in(key, i), (fan_in, cfg.rank), jnp.float32)
        # float32 whatever the model's dtype: bf16 would round away the small updates
        # (a step of 1e-5 on a weight near 0.01 does not change its bf16 value).
        adapters[name] = {
            "a": a / jnp.sqrt(fan_in),
            "b": jnp.zeros((cfg.rank, fan_out), jnp.float32),
        }
    return adapters


def _map_adapted(base: Any, adapters: dict[str, dict[str, jax.Array]], fn) -> Any:
    """``base`` with ``fn(kernel, adapter)`` in place of each adapted kernel; raises
    ``ValueError`` if an adapter matches no kernel of ``base`` (it would train nothing
    the policy uses)."""
    used: set[str] = set()

    def one(path, leaf):
        # A State's leaves sit under their Variable (a trailing ``.value``): keys only.
        name = _key(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
        adapter = adapters.get(name)
        if adapter is None:
            return leaf
        used.add(name)
        return fn(leaf, adapter)

    out = jax.tree_util.tree_map_with_path(one, base)
    if len(used) != len(adapters):
        unused = sorted(set(adapters) - used)
        raise ValueError(f"LoRA adapters match no kernel of the model: {unused[:3]}")
    return out


def merge(base: Any, adapters: dict[str, dict[str, jax.Array]], scale: float) -> Any:
    """``base`` with ``scale * a @ b`` added to each adapted kernel (jit-friendly): the
    parameters the engine receives and an export writes. Summed in float32, rounded once
    to the kernel's dtype.

    Raises ``ValueError`` if an adapter matches no kernel of ``base``.
    """

    def add(leaf, adapter):
        delta = (adapter["a"].astype(jnp.float32) @ adapter["b"].astype(jnp.float32)) * scale
        return (leaf.astype(jnp.float32) + delta).astype(leaf.dtype)

    return _map_adapted(base, adapters, add)


def attach(base: Any, adapters: dict[str, dict[str, jax.Array]], scale: float) -> Any:
    """``base`` with each adapted kernel replaced by a
    :class:`~tunix_agentic.models.transformer.LowRank` (the kernel and its adapter), which
    the model applies as ``x @ w + scale * (x @ a) @ b``: the policy :func:`merge` gives,
    for training. Differentiating through it costs no weight-sized merged copy and no
    full weight gradient per micro-batch, which :func:`merge` inside the loss did (in
    float32: a float32 copy of every adapted kernel per micro-batch).

    Raises ``ValueError`` if an adapter matches no kernel of ``base``.
    """
    return _map_adapted(base, adapters, lambda w, ad: LowRank(w, ad["a"], ad["b"], scale))
