"""One batch through both losses: ours (learners/) in JAX and TRL's in torch, on the same
weights, with the same advantages, old and reference logprobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from tunix_agentic.compare.batch import ParityBatch
from tunix_agentic.compare.mapping import KNOWN_DIFFERENCES, TRLMapping
from tunix_agentic.learners.grpo_config import GRPOConfig

TOLERANCE = 1e-5
# The known differences that change the loss of one batch given the same advantages.
LOSS_DIFFERENCES = (
    "masked_rows",
    "dr_grpo_normaliser",
    "kl_estimator",
    "off_policy",
    "entropy_bonus",
)


@dataclasses.dataclass(frozen=True)
class LossParity:
    """Our loss and TRL's on one batch. ``semantics_match``: the two are the same function
    of the batch for these settings, so ``equal`` (``|ours - trl| <= TOLERANCE``) is
    expected; otherwise ``differences`` names what makes them differ."""

    ours: float
    trl: float
    semantics_match: bool
    differences: tuple[str, ...]

    @property
    def gap(self) -> float:
        return abs(self.ours - self.trl)

    @property
    def equal(self) -> bool:
        return self.gap <= TOLERANCE

    def line(self) -> str:
        verdict = "equal" if self.equal else "differ"
        head = f"loss parity: ours {self.ours:.8f}, TRL {self.trl:.8f}, |gap| {self.gap:.2e} "
        if self.semantics_match:
            head += f"({verdict} within {TOLERANCE:g}; the semantics match)"
        else:
            head += f"({verdict}; expected, because of: {', '.join(self.differences)})"
        return head

    def to_dict(self) -> dict[str, Any]:
        return {
            "ours": self.ours,
            "trl": self.trl,
            "gap": self.gap,
            "tolerance": TOLERANCE,
            "equal": self.equal,
            "semantics_match": self.semantics_match,
            "differences": {d: KNOWN_DIFFERENCES[d] for d in self.differences},
        }


def ours_loss(model, batch: ParityBatch, learner: GRPOConfig) -> float:
    """Our GRPO loss of ``batch`` on ``model`` (an NNX Transformer): the learner's forward
    pass and :func:`~tunix_agentic.learners.losses.policy_loss` with whole-batch weights,
    as :func:`~tunix_agentic.learners.grpo_step.train_step` computes it."""
    import jax.numpy as jnp
    from flax import nnx

    from tunix_agentic.learners.grpo_step import forward
    from tunix_agentic.learners.losses import aggregation_weights, metric_weights, policy_loss

    graphdef, params = nnx.split(model)
    ids = jnp.asarray(batch.input_ids, jnp.int32)
    mask = jnp.asarray(batch.loss_mask, jnp.float32)[:, 1:]
    lp, logp = forward(graphdef, params, ids, learner.temperature)
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    ref = None if batch.ref_logprobs is None else jnp.asarray(batch.ref_logprobs)[:, 1:]
    loss, _ = policy_loss(
        lp,
        jnp.asarray(batch.old_logprobs, jnp.float32)[:, 1:],
        jnp.asarray(batch.advantages, jnp.float32),
        mask,
        aggregation_weights(mask, learner.aggregation, learner.norm_length),
        metric_weights(mask),
        learner.policy_loss,
        ref_logprobs=ref,
        entropy=entropy,
    )
    return float(loss)


def reference_logprobs(model, input_ids: np.ndarray, temperature: float) -> np.ndarray:
    """``[B, T]`` logprobs of each token under ``model`` (0 at position 0), laid out as
    :class:`ParityBatch` wants them."""
    import jax.numpy as jnp
    from flax import nnx

    from tunix_agentic.learners.grpo_step import forward

    graphdef, params = nnx.split(model)
    lp, _ = forward(graphdef, params, jnp.asarray(input_ids, jnp.int32), temperature)
    lp = np.asarray(lp, np.float32)
    return np.concatenate([np.zeros((lp.shape[0], 1), np.float32), lp], axis=1)


def loss_parity(
    hf_dir: str | Path,
    batch: ParityBatch,
    learner: GRPOConfig,
    mapping: TRLMapping,
    *,
    trl_value: float | None = None,
    out_dir: str | Path | None = None,
) -> LossParity:
    """Our loss of ``batch`` on the HF model ``hf_dir`` (loaded in float32) and TRL's
    (``trl_value`` when TRL computed it elsewhere; otherwise a TRL trainer is built here,
    which needs the ``compare`` extra)."""
    from tunix_agentic.models.hf import load_hf_model

    ours = ours_loss(load_hf_model(hf_dir, dtype="float32"), batch, learner)
    if trl_value is None:
        import tempfile

        from tunix_agentic.compare.trl_side import build_trainer, trl_loss

        with tempfile.TemporaryDirectory() as tmp:
            trainer = build_trainer(hf_dir, mapping.kwargs(), out_dir=out_dir or tmp)
            trl_value = trl_loss(trainer, batch)
    return judge(ours, trl_value, batch, mapping)


def judge(ours: float, trl: float, batch: ParityBatch, mapping: TRLMapping) -> LossParity:
    """The verdict on two losses of ``batch``: whether the settings make them the same
    function of the batch, and which known differences apply."""
    return LossParity(
        ours=float(ours),
        trl=float(trl),
        semantics_match=mapping.loss_semantics_match(batch.has_empty_rows),
        differences=tuple(d for d in mapping.differences if d in LOSS_DIFFERENCES),
    )
