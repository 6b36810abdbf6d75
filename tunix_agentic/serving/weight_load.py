"""Weights loaded from disk by ``POST /update_weights_from_disk``, only from named directories.

The server checks the directory it opens (:func:`open_inside`: its path as the kernel
knows it, through the descriptor) and reads the parameters through that descriptor
(:func:`load_pinned`), so a link swapped after the check cannot redirect the load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from tunix_agentic.checkpoint import load_params
from tunix_agentic.models.hf import is_hf_dir, load_hf_params
from tunix_agentic.serving.weights_dir import inside


def open_inside(path: str, roots: tuple[Path, ...]) -> int | None:
    """A descriptor of the directory ``path`` names, if that directory lies inside one of
    ``roots`` (None if it does not; OSError if there is none).

    The check is of the directory opened (its path as the kernel knows it), and the
    parameters are read through the descriptor (:func:`load_pinned`), so a link swapped
    after the check cannot redirect the load.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        raise
    if inside(real, roots):
        return fd
    os.close(fd)
    return None


def load_pinned(fd: int, params_like: Any, cfg: Any = None) -> Any:
    """:func:`load_like` from the directory open as ``fd``, which it closes (here, on the
    loading thread: a cancelled request must not free the number while it is read)."""
    try:
        return load_like(f"/proc/self/fd/{fd}", params_like, cfg)
    finally:
        os.close(fd)


def load_like(path: str, params_like: Any, cfg: Any = None) -> Any:
    """``load_params`` (or, for a Hugging Face model directory or a directory of its
    safetensors alone, named as the model ``cfg`` names them, the tensors), each array
    placed where the engine's current one lives.

    The engine keeps its parameters committed to their devices (it commits what
    ``update_weights`` gets), so arrays placed like them reuse the compiled
    prefill and decode; another placement would compile them again.
    """
    if is_hf_dir(path):
        return load_hf_params(path, params_like)
    if cfg is not None and any(Path(path).glob("*.safetensors")):  # what SGLang reads too
        return load_hf_params(path, params_like, cfg=cfg)
    loaded = load_params(path, params_like)
    return jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), loaded, params_like)
