"""Turn groups of trajectories into padded learner arrays with few distinct shapes.

Rows and length are padded up to buckets so the jitted step compiles once per
bucket rather than once per batch. Padding rows have an all-zero mask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import struct

from tunix_agentic.learners.advantages import BatchAdvantage, overlong_penalty, turn_advantages
from tunix_agentic.learners.configs import OVERLONG_MODES, check_overlong  # noqa: F401

Array = Any  # np.ndarray on the host, jax.Array once placed


@struct.dataclass
class GRPOBatch:
    """One GRPO step's rows, padded to ``[R, T]`` (a pytree: jit, ``device_put`` and the
    mesh's row sharding take it whole). Padding rows have an all-zero mask."""

    input_ids: Array  # [R, T] int32
    loss_mask: Array  # [R, T] float32: 1 on the tokens the policy is trained on
    old_logprobs: Array  # [R, T] float32: the sampler's logprob of each token
    advantages: Array  # [R] float32
    truncated: Array  # [R] float32: 1 for rows of truncated trajectories (is_truncated)
    # [R, T] float32: 1 on tokens sampled under a grammar (Step.constrained), whose
    # old_logprobs are the masked distribution's: left out of the learner/sampler mismatch
    # metrics. None: no such token.
    constrained: Array | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def build(
        cls,
        input_ids: Array,
        loss_mask: Array,
        old_logprobs: Array,
        advantages: Array,
        truncated: Array | None = None,
    ) -> GRPOBatch:
        """A batch from ready ``[R, T]`` / ``[R]`` arrays (no row truncated unless given)."""
        if truncated is None:
            truncated = np.zeros(np.shape(advantages), np.float32)
        return cls(input_ids, loss_mask, old_logprobs, advantages, truncated)


@struct.dataclass
class SFTBatch:
    """Demonstration rows for the warm start, padded to ``[R, T]``; packed rows
    (:func:`pack_sft_rows`) also carry their segments' positions and ids."""

    input_ids: Array  # [R, T] int32
    loss_mask: Array  # [R, T] float32: 1 on the target tokens (the assistant's turns)
    positions: Array | None = None  # [R, T] int32: each segment from 0; None: 0..T-1
    segments: Array | None = None  # [R, T] int32: 1, 2, ... per row, 0 on padding


def bucket_length(n: int, multiple: int = 64, geometric: bool = False) -> int:
    """The padded width for ``n`` tokens: the next multiple of ``multiple``, or with
    ``geometric`` the next of ``multiple`` x 1, 1.5, 2, 3, 4, 6, 8, ... (at most a third
    of a row is padding, and a run meets about two widths per doubling of its length, so
    the jitted step compiles for few shapes even at long sequences)."""
    if not geometric:
        return max(multiple, -(-n // multiple) * multiple)
    if multiple % 2:
        raise ValueError(f"a geometric bucket's base must be even, got {multiple}")
    half, c = multiple // 2, 2  # width = half x c, c in 2, 3, 4, 6, 8, 12, 16, ...
    while half * c < n:
        c = c * 3 // 2 if c & (c - 1) == 0 else c * 4 // 3
    return half * c


def pad_rows(
    rows: Sequence[Mapping[str, np.ndarray]],
    *,
    pad_id: int,
    num_rows: int | None = None,
    length_multiple: int = 64,
    geometric: bool = False,
) -> GRPOBatch:
    """Stack per-trajectory arrays (from ``Trajectory.learner_rows``) into ``[R, T]``,
    T from :func:`bucket_length`; advantages and truncation flags zero (a row without
    ``old_logprobs``, a demonstration's, gets zeros there too). Each row keeps its tokens
    up to its last trained one (:func:`used_length`): a tail no loss reads (the tool
    message that ended an episode cut at the token limit) never widens the batch."""
    if not rows:
        raise ValueError("cannot build a batch from no trajectories")
    r = max(num_rows or len(rows), len(rows))
    lengths = [used_length(x) for x in rows]
    t = bucket_length(max(lengths), length_multiple, geometric)
    out = {
        "input_ids": np.full((r, t), pad_id, np.int32),
        "loss_mask": np.zeros((r, t), np.float32),
        "old_logprobs": np.zeros((r, t), np.float32),
        "constrained": np.zeros((r, t), np.float32),
    }
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        for key in out:
            if key in row:
                out[key][i, :n] = row[key][:n]
    zeros = np.zeros(r, np.float32)
    return GRPOBatch(**out, advantages=zeros, truncated=zeros.copy())


def pad_batch_rows(batch: GRPOBatch, rows: int, pad_id: int = 0) -> GRPOBatch:
    """``batch`` with padding rows appended up to ``rows`` (all-zero mask and advantage:
    they change no loss, gradient or metric); ``batch`` itself when it has that many."""
    have = np.shape(batch.input_ids)[0]
    if have >= rows:
        return batch

    def pad(x, value=0):
        if x is None:
            return None
        x = np.asarray(x)
        return np.concatenate([x, np.full((rows - have, *x.shape[1:]), value, x.dtype)])

    return GRPOBatch(
        pad(batch.input_ids, pad_id),
        pad(batch.loss_mask),
        pad(batch.old_logprobs),
        pad(batch.advantages),
        pad(batch.truncated),
        pad(batch.constrained),
    )


def used_length(row: Mapping[str, np.ndarray]) -> int:
    """The tokens of ``row`` its loss reads: up to its last trained token (``loss_mask``
    > 0) inclusive. A causal model's logprob of a token reads only the tokens before it,
    so what follows the last trained token changes no loss, gradient or metric. A row
    with no trained token keeps one token; one without a mask, all of them."""
    mask = row.get("loss_mask")
    if mask is None:
        return len(row["input_ids"])
    on = np.flatnonzero(np.asarray(mask) > 0)
    return int(on[-1]) + 1 if on.size else 1


def sft_batch(
    rows: Sequence[Mapping[str, np.ndarray]], *, pad_id: int, length_multiple: int = 16
) -> SFTBatch:
    """Demonstration rows (``input_ids``, ``loss_mask``) padded for :class:`SFTTrainer`."""
    batch = pad_rows(rows, pad_id=pad_id, length_multiple=length_multiple)
    return SFTBatch(input_ids=batch.input_ids, loss_mask=batch.loss_mask)


def pack_sft_rows(
    rows: Sequence[Mapping[str, np.ndarray]],
    *,
    pad_id: int,
    length_multiple: int = 16,
    row_multiple: int = 4,
) -> SFTBatch:
    """Demonstration rows packed several to a row: the same tokens, targets and loss as
    :func:`sft_batch`, in fewer padded slots.

    The width is :func:`sft_batch`'s (the longest row's bucket), rows go first-fit in
    decreasing length, and the row count is rounded up to ``row_multiple`` (a handful of
    shapes to compile). Each demonstration is a segment: its positions restart at 0 and
    it attends to itself only, so each token's logprob is the one it has in a row of its
    own. A segment's first token is never a target (its loss mask is set to 0 there), so
    no token is predicted across a boundary; a demonstration starts with its prompt, which
    is never one anyway. ``masked_cross_entropy`` averages over the batch's targets, which
    packing does not change."""
    if not rows:
        raise ValueError("cannot build a batch from no demonstrations")
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
    lengths = [used_length(x) for x in rows]
    width = bucket_length(max(lengths), length_multiple)
    bins: list[list[int]] = []  # row indices per packed row
    free: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: -lengths[i]):
        j = next((j for j, room in enumerate(free) if room >= lengths[i]), len(bins))
        if j == len(bins):
            bins.append([])
            free.append(width)
        bins[j].append(i)
        free[j] -= lengths[i]
    r = -(-len(bins) // row_multiple) * row_multiple
    ids = np.full((r, width), pad_id, np.int32)
    mask = np.zeros((r, width), np.float32)
    positions = np.zeros((r, width), np.int32)
    segments = np.zeros((r, width), np.int32)
    for j, members in enumerate(bins):
        at = 0
        for seg, i in enumerate(members, start=1):
            n = lengths[i]
            ids[j, at : at + n] = rows[i]["input_ids"][:n]
            mask[j, at + 1 : at + n] = rows[i]["loss_mask"][1:n]
            positions[j, at : at + n] = np.arange(n)
            segments[j, at : at + n] = seg
            at += n
        positions[j, at:] = np.arange(width - at)  # padding: segment 0, in index order
    return SFTBatch(ids, mask, positions, segments)


def is_truncated(trajectory) -> bool:
    """Whether an episode was cut off by a length limit: status "max_tokens", or a step the
    engine stopped at its token budget (finish reason "length")."""
    return trajectory.status == "max_tokens" or any(
        s.finish_reason == "length" for s in trajectory.steps
    )


def grpo_batch(
    groups: Sequence,  # Sequence[rollout.Group]
    advantage_fn: Callable[[np.ndarray], np.ndarray] | BatchAdvantage,
    *,
    pad_id: int,
    num_rows: int | None = None,
    length_multiple: int = 64,
    geometric: bool = False,
    task_normalize: bool = False,
    turn_level: bool = False,
    overlong: str = "none",
    overlong_max_len: int = 0,
    overlong_cache_len: int = 0,
    constrained: str = "train",
) -> GRPOBatch:
    """Arrays for one GRPO step: advantages computed within each group.

    A trajectory gives one row, or one per step when its steps saw less than the
    whole history (``Trajectory.learner_rows``), each with the trajectory's
    advantage; the row count is then padded up to a multiple of ``num_rows`` so
    the step compiles for few shapes. With ``turn_level`` a step row's advantage
    adds the step's standardised process return-to-go (:func:`turn_advantages`). Under ``token_mean`` that weighs every
    action token as the one-row form would; under the ``seq_mean_*``
    aggregations each step row counts as a sequence, so an episode weighs in
    proportion to its steps. ``task_normalize`` (AgentRL's task advantage normalisation) then
    standardises the advantages of each task name across the batch, so tasks
    with different reward scales or group sizes pull with equal weight.

    ``advantage_fn`` is a group-level estimator (``[G] -> [G]``, called per group) or a
    :class:`BatchAdvantage` (called once over every trajectory, with group ids and task
    names). Overlong responses (DAPO, Yu et al. 2025; truncation per :func:`is_truncated`):
    ``overlong="mask"`` zeroes the loss mask of every row of a truncated trajectory (its
    reward still counts in the group statistics); ``"penalty"`` adds
    :func:`overlong_penalty` of ``num_generated`` (``overlong_max_len``,
    ``overlong_cache_len``) to each reward before the advantages. ``truncated`` marks the
    rows of truncated trajectories whatever the mode (0 for padding rows).
    ``constrained`` ("train" or "mask"): what becomes of tokens sampled under a grammar
    (``Trajectory.learner_arrays``; ``learner.constrained_tokens``).
    """
    check_overlong(overlong, overlong_max_len, overlong_cache_len)
    group_rewards = []
    for group in groups:
        rewards = np.asarray(group.rewards, np.float32)
        if overlong == "penalty":
            lengths = [t.num_generated for t in group.trajectories]
            rewards = rewards + overlong_penalty(lengths, overlong_max_len, overlong_cache_len)
        group_rewards.append(rewards)
    group_advantages = _advantages(groups, group_rewards, advantage_fn)

    rows, advantages, names, truncated = [], [], [], []
    for group, adv in zip(groups, group_advantages, strict=True):
        per_step = turn_advantages(
            adv, [np.asarray([st.reward for st in t.steps]) for t in group.trajectories]
        )
        for traj, a, steps in zip(group.trajectories, adv, per_step, strict=True):
            mine = traj.learner_rows(constrained=constrained)
            cut = is_truncated(traj)
            if overlong == "mask" and cut:
                mine = [{**row, "loss_mask": np.zeros_like(row["loss_mask"])} for row in mine]
            rows += mine
            if turn_level and len(mine) == len(traj.steps):  # a row per step
                advantages += [float(x) for x in steps]
            else:
                advantages += [float(a)] * len(mine)
            names += [traj.task_name] * len(mine)
            truncated += [float(cut)] * len(mine)
    if task_normalize:
        advantages = normalize_by_task(np.asarray(advantages, np.float32), names).tolist()
    if num_rows and len(rows) > num_rows:
        num_rows = -(-len(rows) // num_rows) * num_rows
    batch = pad_rows(
        rows,
        pad_id=pad_id,
        num_rows=num_rows,
        length_multiple=length_multiple,
        geometric=geometric,
    )
    adv, flags = np.zeros(batch.num_rows, np.float32), np.zeros(batch.num_rows, np.float32)
    adv[: len(advantages)] = advantages
    flags[: len(truncated)] = truncated
    return batch.replace(advantages=adv, truncated=flags)


def finite_groups(groups: Sequence, advantage_fn) -> tuple[list, int]:
    """The groups whose float32 rewards, and group-level advantages, are all finite, and how
    many were left out. A reward past float32's range (``1e308`` is ``inf`` there) makes its
    group's advantages NaN, and one NaN row poisons the whole update: such a group is never
    trained on. (A batch-level estimator's advantages are checked with the batch.)"""
    kept = []
    with np.errstate(all="ignore"):  # an overflow here is what is being looked for
        for group in groups:
            rewards = np.asarray(group.rewards, np.float64).astype(np.float32)
            if not np.all(np.isfinite(rewards)):
                continue
            if not isinstance(advantage_fn, BatchAdvantage) and not np.all(
                np.isfinite(advantage_fn(rewards))
            ):
                continue
            kept.append(group)
    return kept, len(groups) - len(kept)


def _advantages(
    groups: Sequence, group_rewards: list[np.ndarray], advantage_fn
) -> list[np.ndarray]:
    """Per-group advantage arrays: per group, or once over the batch for a batch-level fn."""
    if not isinstance(advantage_fn, BatchAdvantage):
        return [advantage_fn(r) for r in group_rewards]
    if not group_rewards:
        return []
    ids = np.concatenate([np.full(len(r), i) for i, r in enumerate(group_rewards)])
    names = [t.task_name for g in groups for t in g.trajectories]
    flat = advantage_fn(np.concatenate(group_rewards), ids, names)
    return np.split(flat, np.cumsum([len(r) for r in group_rewards])[:-1])


def normalize_by_task(
    advantages: np.ndarray, task_names: Sequence[str], eps: float = 1e-6
) -> np.ndarray:
    """Zero mean, unit std of the advantages within each task name ([N] -> [N])."""
    out = np.asarray(advantages, np.float32).copy()
    names = np.asarray(task_names)
    for name in np.unique(names):
        idx = names == name
        a = out[idx]
        out[idx] = (a - a.mean()) / (a.std() + eps)
    return out
