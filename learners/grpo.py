"""The GRPO learner: one jitted, donating train step over padded, masked arrays.

The step optionally splits the batch's rows into micro-batches and accumulates their
gradients (``learner.micro_batch_rows``): every loss term is row-local and weighed by
whole-batch normalisers (:func:`~tunix_agentic.learners.losses.aggregation_weights`), so
the update equals the whole batch's. With a mesh (:mod:`tunix_agentic.sharding`) the
parameters and optimizer state are sharded by the logical-axis rules and the rows over
``fsdp``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tunix_agentic.learners.advantages import get_advantage_fn
from tunix_agentic.learners.batching import OVERLONG_MODES
from tunix_agentic.learners.diagnostics import cross_pairs, mi_from_scores
from tunix_agentic.learners.lora import LoRAConfig, init_adapters
from tunix_agentic.learners.lora import merge as lora_merge
from tunix_agentic.learners.losses import (
    AGGREGATIONS,
    PolicyLossConfig,
    aggregation_weights,
    kl_penalized_advantages,
    metric_weights,
    mismatch_metrics,
    policy_loss,
    sequence_kl,
)
from tunix_agentic.learners.state import (
    OptimizerConfig,
    TrainState,
    apply_gradients,
    make_optimizer,
)
from tunix_agentic.sharding import (
    MeshConfig,
    make_mesh,
    put_batch,
    replicated,
    shard_tree,
    tree_shardings,
)


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4)
    # Advantage estimator by name (learners/advantages.py): grpo, grpo_bessel, dr_grpo, rloo
    # (within a group), reinforce, reinforce_pp, erpo (over the batch).
    advantage: str = "grpo"
    aggregation: str = "token_mean"
    # "ppo": token ratios (PPO / GRPO); "gspo": one sequence-level ratio per row (GSPO).
    loss_type: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 0.0  # > 1: a negative advantage's loss is capped at -c * A
    kl_coef: float = 0.0  # off by default (StarPO-S)
    kl_estimator: str = "k3"  # k1 / k2 / k3 (Schulman 2020)
    kl_penalty: str = "loss"  # "loss": a loss term; "reward": folded into the advantage
    # TRL's default: the k3 KL weighted by the ratio to the sampling policy.
    kl_ratio_corrected: bool = False
    entropy_coef: float = 0.0  # an entropy bonus
    # Dr. GRPO's constant for seq_mean_token_sum_norm (e.g. agent.max_new_tokens x turns);
    # 0: the batch's padded width, which moves with its length bucket.
    norm_length: int = 0
    temperature: float = 1.0  # must match the sampling temperature, so ratios start at 1
    task_normalize: bool = False  # AgentRL task advantage normalisation across the batch
    # With one learner row per step (a sliding-window context): add each step's standardised
    # process return-to-go (StepResult rewards) to the trajectory's advantage.
    turn_advantage: bool = False
    # Truncated importance sampling: > 0 turns on the decoupled objective (ratio to the
    # learner's own pre-update policy, per-token weight min(p_prox / p_sampler, tis_cap)).
    tis_cap: float = 0.0
    # Beyond TIS: drop rows ("sequence") or tokens ("token", IcePop) whose learner/sampler
    # probability ratio leaves [off_policy_low, off_policy_high].
    off_policy_mask: str = "none"
    off_policy_low: float = 0.5
    off_policy_high: float = 2.0
    # Truncated responses (DAPO): "mask" trains nothing on them; "penalty" lowers the
    # reward linearly from 0 at overlong_max_len - overlong_cache_len to -1 at max_len.
    overlong: str = "none"
    overlong_max_len: int = 0
    overlong_cache_len: int = 0
    # Rows are padded to this width x 1, 1.5, 2, 3, 4, 6, ... (learners/batching.py:
    # bucket_length): at most a third padding, about two compiled shapes per doubling.
    length_bucket: int = 32
    # Gradient accumulation: rows per micro-batch (0: the whole batch at once); the update
    # equals the whole batch's. The batch's row count must be a multiple of it.
    micro_batch_rows: int = 0
    remat: bool = False  # recompute each layer's activations in the backward pass
    # Collapse diagnostic (RAGEN-2): score k responses against k distinct prompts each step
    # (k*k forward rows); 0 turns it off.
    mi_pairs: int = 4
    # Devices of the learner (tunix_agentic.sharding): fsdp x tp, and which devices
    # ("start:stop"); the default is one device. Colocated with the engine when both name
    # the same devices, disaggregated when they name different ones.
    mesh: MeshConfig = MeshConfig()
    # Low-rank adapters (rank > 0): only they are trained; the engine gets them merged.
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self):
        try:
            get_advantage_fn(self.advantage)
        except ValueError as exc:
            raise ValueError(f"learner.advantage: {exc}") from None
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"learner.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"
            )
        self.policy_loss  # noqa: B018 - validates the loss's fields
        if self.norm_length < 0:
            raise ValueError(f"learner.norm_length must be >= 0, got {self.norm_length}")
        if not self.temperature > 0:
            raise ValueError(f"learner.temperature must be > 0, got {self.temperature}")
        if self.overlong not in OVERLONG_MODES:
            raise ValueError(
                f"learner.overlong must be one of {OVERLONG_MODES}, got {self.overlong!r}"
            )
        if self.overlong == "penalty" and not (
            0 < self.overlong_cache_len <= self.overlong_max_len
        ):
            raise ValueError(
                "learner.overlong: penalty needs 0 < overlong_cache_len <= overlong_max_len, "
                f"got {self.overlong_cache_len} and {self.overlong_max_len}"
            )
        if self.loss_type == "gspo" and max(self.clip_low, self.clip_high) > 0.01:
            warnings.warn(
                f"learner.loss_type=gspo with clip_low={self.clip_low}, "
                f"clip_high={self.clip_high}: a sequence-level ratio rarely leaves so wide a "
                "band (GSPO uses about 3e-4 and 4e-4), so there is little trust region",
                stacklevel=2,
            )
        if self.length_bucket < 2 or self.length_bucket % 2:
            raise ValueError(
                f"learner.length_bucket must be an even number >= 2, got {self.length_bucket}"
            )
        for name in ("micro_batch_rows", "mi_pairs"):
            if getattr(self, name) < 0:
                raise ValueError(f"learner.{name} must be >= 0, got {getattr(self, name)}")
        if self.mi_pairs == 1:
            raise ValueError("learner.mi_pairs must be 0 (off) or >= 2, got 1")

    @property
    def policy_loss(self) -> PolicyLossConfig:
        return PolicyLossConfig(
            loss_type=self.loss_type,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip,
            kl_coef=self.kl_coef,
            kl_estimator=self.kl_estimator,
            kl_ratio_corrected=self.kl_ratio_corrected,
            kl_penalty=self.kl_penalty,
            entropy_coef=self.entropy_coef,
            tis_cap=self.tis_cap,
            off_policy_mask=self.off_policy_mask,
            off_policy_low=self.off_policy_low,
            off_policy_high=self.off_policy_high,
        )

    @property
    def uses_proximal(self) -> bool:
        """The decoupled objective: the ratio is to the learner's own pre-update policy and
        the sampler's logprobs only weigh or mask (TIS, off-policy masking)."""
        return self.tis_cap > 0 or self.off_policy_mask != "none"


class GRPOLearner:
    """Holds the policy's train state; ``train_step(batch)`` returns float metrics.

    ``batch`` comes from :func:`tunix_agentic.learners.batching.grpo_batch`. With ``kl_coef >
    0`` a frozen copy of the initial parameters serves as the reference policy. With
    ``lora.rank > 0`` the model's parameters are frozen (``base``) and only adapters are
    trained (``state.params``); :meth:`params_for_engine` returns them merged.

    ``mesh`` (default: from ``config.mesh``; none for one device): shard parameters,
    optimizer state and reference by :mod:`tunix_agentic.sharding`'s rules and the batch's
    rows over ``fsdp`` (the row count must then be a multiple of the fsdp size, and of
    ``micro_batch_rows``; :meth:`row_multiple`).
    """

    def __init__(
        self,
        model: nnx.Module,
        config: GRPOConfig = GRPOConfig(),
        *,
        seed: int = 0,
        mesh: Mesh | None = None,
    ):
        self.config = config
        if mesh is None and not config.mesh.trivial:
            mesh = make_mesh(config.mesh)
        self.mesh = mesh
        optimizer = make_optimizer(config.optimizer)
        self.base = None
        if config.lora.enabled:
            _, base = nnx.split(model, nnx.Param)
            self.base = jax.tree.map(jnp.copy, base)
            if mesh is not None:
                self.base = shard_tree(self.base, mesh)
            adapters = init_adapters(self.base, config.lora, jax.random.key(seed))
            self.state = TrainState(model, optimizer, trainable=adapters, mesh=mesh)
        else:
            self.state = TrainState(
                model, optimizer, master_dtype=config.optimizer.master_dtype, mesh=mesh
            )
        step_kwargs: dict[str, Any] = {}
        if mesh is not None:
            step_kwargs["out_shardings"] = (
                tree_shardings(self.state.params, mesh),
                tree_shardings(self.state.opt_state, mesh),
                replicated(mesh),
            )
        # The KL reference: the policy as it starts. Under LoRA that is the frozen base itself
        # (fresh adapters add nothing; neither is donated, so no copy is needed).
        self.ref_params = None
        if config.kl_coef > 0:
            self.ref_params = self.base if self.base is not None else self.state.params_copy()
        self.advantage_fn = get_advantage_fn(config.advantage)
        self.compiles = 0
        self._step = jax.jit(self._step_impl, donate_argnums=(0, 1), **step_kwargs)
        self._merge = jax.jit(self._full)
        self._pair_scores = jax.jit(
            self._pair_scores_impl,
            **({"out_shardings": replicated(mesh)} if mesh is not None else {}),
        )

    def row_multiple(self) -> int:
        """A batch's row count must be a multiple of this (micro-batches, fsdp shards)."""
        fsdp = self.mesh.shape["fsdp"] if self.mesh is not None else 1
        return math.lcm(fsdp, self.config.micro_batch_rows or 1)

    def _full(self, params, base):
        """The policy's full parameter tree: ``params`` itself, or base + merged adapters."""
        if base is None:
            return params
        return lora_merge(base, params, self.config.lora.scale)

    def _forward(self, params, input_ids, *, remat: bool = False):
        """Per-token logprobs of ``input_ids[:, 1:]`` and the full log-softmax they come
        from (one pass over the vocabulary serves logprobs and entropy)."""
        model = nnx.merge(self.state.graphdef, params)
        b, t = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        logits, _ = model(input_ids, positions, remat=remat)
        logp = jax.nn.log_softmax(logits[:, :-1] / self.config.temperature, axis=-1)
        return jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0], logp

    def _logprobs(self, params, input_ids):
        return self._forward(params, input_ids)[0]

    def _step_impl(self, params, opt_state, ref_params, base, batch):
        self.compiles += 1  # counted while tracing only
        cfg = self.config
        loss_cfg = cfg.policy_loss
        mask = batch["loss_mask"][:, 1:]
        # Whole-batch normalisers, sliced with the rows: micro-batches add up exactly.
        arrays = {
            "ids": batch["input_ids"],
            "mask": mask,
            "sampler": batch["old_logprobs"][:, 1:],
            "adv": batch["advantages"],
            "loss_w": aggregation_weights(mask, cfg.aggregation, cfg.norm_length),
            "metric_w": metric_weights(mask),
            "row_w": jnp.any(mask > 0, axis=-1) / jnp.maximum(jnp.sum(jnp.any(mask > 0, -1)), 1),
        }
        rows = mask.shape[0]
        micro = cfg.micro_batch_rows or rows
        if rows % micro:
            raise ValueError(
                f"learner.micro_batch_rows={micro} does not divide the batch's {rows} rows"
            )
        n_micro = rows // micro

        def micro_step(grads_acc, mb):
            ids, m = mb["ids"], mb["mask"]
            ref = None
            if ref_params is not None:
                ref = jax.lax.stop_gradient(self._logprobs(ref_params, ids))
            old, behaviour = mb["sampler"], None
            if cfg.uses_proximal:  # the sampler's logprobs weigh; the ratio is to our own
                behaviour = old
                old = jax.lax.stop_gradient(self._logprobs(self._full(params, base), ids))
            adv = mb["adv"]
            extra = {}
            if ref is not None and cfg.kl_penalty == "reward":
                seq_kl = sequence_kl(old, ref, m, cfg.kl_estimator)
                adv = kl_penalized_advantages(adv, seq_kl, cfg.kl_coef)
                # The advantage subtracted, averaged over the batch's rows with tokens.
                extra["kl_penalty_mean"] = jnp.sum(cfg.kl_coef * seq_kl * mb["row_w"])

            def loss_fn(p):
                lp, logp = self._forward(self._full(p, base), ids, remat=cfg.remat)
                entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
                if not cfg.entropy_coef:
                    entropy = jax.lax.stop_gradient(entropy)
                loss, aux = policy_loss(
                    lp,
                    old,
                    adv,
                    m,
                    mb["loss_w"],
                    mb["metric_w"],
                    loss_cfg,
                    ref_logprobs=ref,
                    behaviour_logprobs=behaviour,
                    entropy=entropy,
                )
                aux.setdefault("entropy", jnp.sum(jax.lax.stop_gradient(entropy) * mb["metric_w"]))
                return loss, (aux, jax.lax.stop_gradient(lp))

            (loss, (aux, lp)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            grads_acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), grads_acc, grads)
            return grads_acc, ({"loss": loss, **aux, **extra}, lp)

        if n_micro == 1:
            grads, (sums, lp) = micro_step(jax.tree.map(jnp.zeros_like, params), arrays)
        else:
            # Summed in float32 whatever the parameters' dtype, then cast back: bf16 sums
            # over micro-batches would round away what the whole batch keeps.
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
            # Micro-batch j takes rows j, j + n_micro, ...: strided, so with rows sharded
            # over fsdp in blocks every micro-batch spans every device.
            stacked = jax.tree.map(
                lambda x: x.reshape(micro, n_micro, *x.shape[1:]).swapaxes(0, 1), arrays
            )
            grads, (per_micro, lp) = jax.lax.scan(micro_step, zeros, stacked)
            sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), per_micro)
            lp = lp.swapaxes(0, 1).reshape(rows, -1)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        metrics = dict(sums)
        metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        # Learner vs sampler on the whole batch (quantiles do not add up over micro-batches).
        metrics.update(mismatch_metrics(lp, arrays["sampler"], mask))
        params, opt_state = apply_gradients(self.state.optimizer, params, opt_state, grads)
        return params, opt_state, metrics

    def _pair_scores_impl(self, params, base, pair_ids, pair_mask):
        lp = self._logprobs(self._full(params, base), pair_ids)
        return jnp.sum(lp * pair_mask[:, 1:], axis=-1)

    def collapse_metrics(self, batch: dict[str, np.ndarray], pad_id: int = 0) -> dict[str, float]:
        """RAGEN-2's mutual-information proxy on up to ``mi_pairs`` responses of distinct
        prompts: how well each response picks out its own prompt under the current policy
        (:mod:`tunix_agentic.learners.diagnostics`). Empty when fewer than two distinct
        prompts have responses."""
        k = self.config.mi_pairs
        ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["loss_mask"])
        seen, keep = set(), []
        for i in range(ids.shape[0]):
            on = np.flatnonzero(mask[i] > 0)
            if on.size and (prompt := ids[i, : on[0]].tobytes()) not in seen:
                seen.add(prompt)
                keep.append(i)
            if len(keep) == k:
                break
        if len(keep) < 2:
            return {}
        # Padded like training rows (few compiled shapes), rows to a multiple of the fsdp
        # size so they split over the mesh like a batch.
        pair_ids, pair_mask = cross_pairs(
            ids[keep], mask[keep], len(keep), pad_id, self.config.length_bucket, geometric=True
        )
        n = len(keep) * len(keep)
        rows = -(-n // self.row_multiple()) * self.row_multiple()
        pair_ids = np.pad(pair_ids, ((0, rows - n), (0, 0)), constant_values=pad_id)
        pair_mask = np.pad(pair_mask, ((0, rows - n), (0, 0)))
        if self.mesh is not None:
            placed = put_batch({"ids": pair_ids, "mask": pair_mask}, self.mesh)
            pair_ids, pair_mask = placed["ids"], placed["mask"]
        scores = np.asarray(self._pair_scores(self.state.params, self.base, pair_ids, pair_mask))[
            :n
        ].reshape(len(keep), len(keep))
        return {f"collapse/{k}": float(v) for k, v in mi_from_scores(scores).items()}

    def train_step(self, batch: dict[str, np.ndarray], *, pad_id: int = 0) -> dict[str, float]:
        s = self.state
        extra = self.collapse_metrics(batch, pad_id) if self.config.mi_pairs else {}
        if self.mesh is not None:
            batch = put_batch(batch, self.mesh)
        s.params, s.opt_state, metrics = self._step(
            s.params, s.opt_state, self.ref_params, self.base, batch
        )
        s.step += 1
        return {**{k: float(v) for k, v in metrics.items()}, **extra}

    def params_for_engine(self) -> Any:
        """The policy's full parameters, fresh arrays (LoRA adapters merged in)."""
        if self.base is None:
            return self.state.params_for_model()
        return self._merge(self.state.params, self.base)

    def policy_model(self) -> nnx.Module:
        """A module of the current policy (a copy; LoRA adapters merged in)."""
        return nnx.merge(self.state.graphdef, self.params_for_engine())

    def checkpoint_params(self) -> Any:
        """What a checkpoint holds besides the optimizer state: the parameters, or under
        LoRA the frozen base and the adapters (the base may differ from its source, e.g.
        after a warm start)."""
        if self.base is None:
            return self.state.params
        return {"base": self.base, "adapters": self.state.params}

    def load_checkpoint(self, params: Any, opt_state: Any | None, step: int) -> None:
        """Restore what :meth:`checkpoint_params` saved."""
        if self.base is not None:
            self.base, params = params["base"], params["adapters"]
            if self.mesh is not None:
                self.base = shard_tree(self.base, self.mesh)
            if self.ref_params is not None:
                self.ref_params = self.base  # the base the run's adapters were trained on
        if self.mesh is not None:
            params = shard_tree(params, self.mesh)
            if opt_state is not None:
                opt_state = shard_tree(opt_state, self.mesh)
        self.state.load(params, opt_state, step)
