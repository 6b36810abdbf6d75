"""Collapse diagnostics beyond entropy (pure NumPy, host side).

A policy can keep a healthy token entropy while its responses stop depending on the
prompt (template collapse: the same plan whatever the task). RAGEN-2 (2025) measures that
with a cheap mutual-information proxy: how well a response identifies its own prompt
among the batch's prompts. The learner scores every (prompt j, response i) pair built by
:func:`cross_pairs` with its own policy, ``scores[i, j] = sum log p(response i | prompt
j)``, and :func:`mi_from_scores` turns the ``[k, k]`` matrix into figures.
"""

from __future__ import annotations

import numpy as np

from tunix_agentic.learners.batching import bucket_length


def cross_pairs(
    input_ids: np.ndarray,
    loss_mask: np.ndarray,
    k: int,
    pad_id: int,
    length_multiple: int = 1,
    geometric: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Every (prompt j, response i) sequence of the first ``k`` rows that have response tokens.

    A row's prompt is its tokens before its first masked token; its response runs from
    the first to the last masked token (observations between turns included, with mask 0).
    Pair ``i * k + j`` is prompt j followed by response i, so the scores reshape to
    ``[k, k]`` with ``scores[i, j]``. ``pair_mask`` is the response's loss mask placed
    after the prompt, aligned with ``pair_ids`` as ``loss_mask`` is with ``input_ids``
    (token t is scored from the logits at t - 1). Fewer than ``k`` such rows: k shrinks to
    their number. Returns ``pair_ids`` ``[k*k, T']`` (``pad_id``-padded, int32) and
    ``pair_mask`` ``[k*k, T']`` (float32), T' the longest pair rounded up to
    ``length_multiple``.
    """
    ids = np.asarray(input_ids)
    mask = np.asarray(loss_mask)
    rows = [i for i in range(ids.shape[0]) if mask[i].any()][:k]
    prompts, responses, masks = [], [], []
    for i in rows:
        on = np.flatnonzero(mask[i] > 0)
        first, last = on[0], on[-1] + 1
        prompts.append(ids[i, :first])
        responses.append(ids[i, first:last])
        masks.append(mask[i, first:last])
    k = len(rows)
    longest = max((len(p) for p in prompts), default=0) + max(
        (len(r) for r in responses), default=0
    )
    width = bucket_length(longest, length_multiple, geometric)
    pair_ids = np.full((k * k, width), pad_id, np.int32)
    pair_mask = np.zeros((k * k, width), np.float32)
    for i in range(k):
        for j in range(k):
            p, r = len(prompts[j]), len(responses[i])
            pair_ids[i * k + j, :p] = prompts[j]
            pair_ids[i * k + j, p : p + r] = responses[i]
            pair_mask[i * k + j, p : p + r] = masks[i]
    return pair_ids, pair_mask


def mi_from_scores(scores: np.ndarray) -> dict[str, float]:
    """Prompt-identification figures from ``scores[i, j] = sum log p(response i | prompt j)``.

    - retrieval_accuracy: the fraction of responses whose own prompt scores strictly
      highest (ties count as misses, so a fully collapsed policy reads 0, not 1/k);
    - mutual_information_nats: the InfoNCE estimate ``mean_i[scores[i, i] - logsumexp_j
      scores[i, j] + log k]`` (van den Oord et al. 2018, "Representation Learning with
      Contrastive Predictive Coding"): about ``log k`` when responses identify their
      prompts, 0 when a response is equally likely under every prompt (RAGEN-2, 2025);
    - mutual_information_nats_max: ``log k``, the estimate's ceiling.
    """
    s = np.asarray(scores, np.float64)
    k = s.shape[0]
    if s.shape != (k, k) or k == 0:
        raise ValueError(f"scores must be a non-empty square matrix, got shape {s.shape}")
    own = np.diag(s)
    others = np.where(np.eye(k, dtype=bool), -np.inf, s)
    hits = own > others.max(axis=1) if k > 1 else np.ones(1, bool)
    top = s.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(s - top).sum(axis=1))
    return {
        "retrieval_accuracy": float(hits.mean()),
        "mutual_information_nats": float(np.mean(own - lse + np.log(k))),
        "mutual_information_nats_max": float(np.log(k)),
    }
