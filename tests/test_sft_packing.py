"""Packed warm-start rows (learners/batching.py ``pack_sft_rows``): the same targets and the
same loss as one demonstration a row, in fewer slots, on the default task's demonstrations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.data.demos import DemoSource, demonstration_batches
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.learners.batching import pack_sft_rows, sft_batch
from tunix_agentic.learners.sft import SFTTrainer
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.transformer import Transformer, sequence_logprobs
from tunix_agentic.testing import TINY

TEMPLATE = ChatTemplate(CharTokenizer(128))


def _rows(batch_size: int = 32, seed: int = 3):
    sources = {"arith": DemoSource(ArithmeticTasks(), ArithmeticEnv().tool_schemas())}
    batches = demonstration_batches(
        sources, TEMPLATE, seed=seed, batch_size=batch_size, tool_fraction=0.4
    )
    return next(batches)


def _targets(batch) -> list[tuple[int, ...]]:
    """Each row's (segment's) target tokens, in order: what the loss reads."""
    ids, mask = np.asarray(batch.input_ids), np.asarray(batch.loss_mask)
    segs = np.ones_like(ids) if batch.segments is None else np.asarray(batch.segments)
    out = []
    for r in range(ids.shape[0]):
        for s in sorted(set(segs[r][mask[r] > 0].tolist())):
            on = (segs[r] == s) & (mask[r] > 0)
            out.append(tuple(ids[r][on].tolist()))
    return sorted(out)


def test_packing_keeps_every_target_in_fewer_slots():
    rows = _rows()
    plain = sft_batch(rows, pad_id=0)
    packed = pack_sft_rows(rows, pad_id=0)
    assert _targets(packed) == _targets(plain)  # the same tokens, each demonstration's own
    assert packed.input_ids.shape[1] == plain.input_ids.shape[1]
    assert packed.input_ids.shape[0] % 4 == 0
    assert packed.input_ids.size <= 0.75 * plain.input_ids.size, (
        packed.input_ids.shape,
        plain.input_ids.shape,
    )
    # Each segment restarts its positions, and its first token is no target.
    seg, pos, mask = (np.asarray(x) for x in (packed.segments, packed.positions, packed.loss_mask))
    starts = (seg > 0) & np.concatenate(
        [np.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], 1
    )
    assert (pos[starts] == 0).all() and (mask[starts] == 0).all()
    assert starts.sum() == len(rows)
    with pytest.raises(ValueError, match="no demonstrations"):
        pack_sft_rows([], pad_id=0)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_a_packed_segment_scores_as_its_own_row(scan):
    """Per-token logprobs of each packed segment equal its row's alone (attention kept
    within the segment, positions from 0), unrolled and with the layers scanned."""
    rows = _rows(batch_size=8)
    model = Transformer(dataclasses.replace(TINY, scan_layers=scan), rngs=nnx.Rngs(0))
    packed = pack_sft_rows(rows, pad_id=0)
    lp = np.asarray(
        jax.jit(lambda b: sequence_logprobs(model, b.input_ids, b.positions, b.segments))(packed)
    )
    seg, ids = np.asarray(packed.segments), np.asarray(packed.input_ids)
    spans = [
        np.flatnonzero(seg[r] == k) for r in range(seg.shape[0]) for k in range(1, seg[r].max() + 1)
    ]
    rows_of = [r for r in range(seg.shape[0]) for _ in range(seg[r].max())]
    assert len(spans) == len(rows)
    # Each segment alone at the start of a row of its own (right padding: unread).
    alone_ids = np.zeros((len(spans), ids.shape[1]), np.int32)
    for i, (r, at) in enumerate(zip(rows_of, spans, strict=True)):
        alone_ids[i, : len(at)] = ids[r, at]
    alone = np.asarray(jax.jit(lambda x: sequence_logprobs(model, x))(jnp.asarray(alone_ids)))
    for i, (r, at) in enumerate(zip(rows_of, spans, strict=True)):
        # Position t predicts token t + 1: the segment's tokens after its first.
        np.testing.assert_allclose(
            lp[r, at[0] : at[-1]], alone[i, : len(at) - 1], rtol=2e-5, atol=2e-5
        )


def test_a_packed_step_is_the_plain_step():
    """One warm-start update on packed rows: the same loss, accuracy and new weights as on
    one demonstration a row (the loss is a mean over the same targets)."""
    rows = _rows()
    out, weights = {}, {}
    for name, batch in (
        ("plain", sft_batch(rows, pad_id=0)),
        ("packed", pack_sft_rows(rows, pad_id=0)),
    ):
        trainer = SFTTrainer(Transformer(TINY, rngs=nnx.Rngs(0)))
        out[name] = trainer.train_step(batch)
        weights[name] = jax.tree.leaves(nnx.state(trainer.state.model(), nnx.Param))
    assert out["packed"]["loss"] == pytest.approx(out["plain"]["loss"], rel=1e-5)
    assert out["packed"]["token_accuracy"] == pytest.approx(out["plain"]["token_accuracy"])
    for a, b in zip(weights["plain"], weights["packed"], strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
