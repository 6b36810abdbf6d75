"""The one batch both losses see: our GRPO batch's arrays, saved and reshaped for TRL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class ParityBatch:
    """Rows of prompt + completion ids, laid out as :class:`GRPOBatch` lays them out.

    ``input_ids``, ``loss_mask``, ``old_logprobs``, ``ref_logprobs`` are ``[B, T]``:
    position ``t`` of the float arrays is about token ``t`` (the logprob of producing
    it; mask 1 where it is trained). ``advantages`` ``[B]``. ``ref_logprobs`` may be
    None (no KL term).
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    old_logprobs: np.ndarray
    advantages: np.ndarray
    ref_logprobs: np.ndarray | None = None

    def __post_init__(self):
        b, t = np.shape(self.input_ids)
        for name in ("loss_mask", "old_logprobs", "ref_logprobs"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != (b, t):
                raise ValueError(f"{name} has shape {np.shape(value)}, input_ids {(b, t)}")
        if np.shape(self.advantages) != (b,):
            raise ValueError(f"advantages has shape {np.shape(self.advantages)}, want ({b},)")
        if not np.any(np.asarray(self.loss_mask)[:, 1:] > 0):
            raise ValueError("loss_mask trains no token (position 0 cannot be trained)")

    @property
    def has_empty_rows(self) -> bool:
        """Whether some row has no trained token (padding rows, masked rows)."""
        return bool(np.any(np.asarray(self.loss_mask).sum(-1) == 0))

    def save(self, path: str | Path) -> Path:
        arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        np.savez(path, **{k: np.asarray(v) for k, v in arrays.items() if v is not None})
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> ParityBatch:
        with np.load(path) as z:
            return cls(**{k: z[k] for k in z.files})


def split_for_trl(batch: ParityBatch) -> dict[str, np.ndarray]:
    """TRL's inputs for ``GRPOTrainer._compute_loss``: prompt / completion split at the
    first trained position P of any row (every row keeps its own positions: nothing is
    left-padded), our loss mask as ``tool_mask`` (tokens past P that are not trained, a
    later prompt or a tool's output, weigh 0), the completion mask 1 up to each row's
    last trained token, and the float arrays cut at P (ours are about token t, TRL's
    per-token logprobs about completion token t too)."""
    mask = np.asarray(batch.loss_mask, np.float32)
    trained = np.nonzero(mask.any(axis=0))[0]
    p = int(trained[0])
    ids = np.asarray(batch.input_ids, np.int64)
    b, t = ids.shape
    last = np.where(mask.any(-1), t - 1 - np.argmax(mask[:, ::-1] > 0, axis=-1), p - 1)
    completion_mask = (np.arange(p, t)[None, :] <= last[:, None]).astype(np.int64)
    out = {
        "prompt_ids": ids[:, :p],
        "prompt_mask": np.ones((b, p), np.int64),
        "completion_ids": ids[:, p:],
        "completion_mask": completion_mask,
        "tool_mask": mask[:, p:].astype(np.int64),
        "old_per_token_logps": np.asarray(batch.old_logprobs, np.float32)[:, p:],
        "advantages": np.asarray(batch.advantages, np.float32),
    }
    if batch.ref_logprobs is not None:
        out["ref_per_token_logps"] = np.asarray(batch.ref_logprobs, np.float32)[:, p:]
    return out
