"""The GRPO learner's step, with and without truncated importance sampling."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tunix_agentic.learners.batching import GRPOBatch
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.models.transformer import sequence_logprobs
from tunix_agentic.testing import on_policy_batch, tiny_model


def _batch(model, behaviour_shift: float = 0.0) -> GRPOBatch:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, model.cfg.vocab_size, (4, 12)).astype(np.int32)
    mask = np.zeros((4, 12), np.float32)
    mask[:, 5:] = 1.0  # the last 7 tokens were generated
    old = np.zeros((4, 12), np.float32)
    old[:, 1:] = np.asarray(sequence_logprobs(model, ids)) + behaviour_shift
    return GRPOBatch.build(
        input_ids=ids,
        loss_mask=mask,
        old_logprobs=old,
        advantages=np.array([1.0, 0.5, 2.0, 1.0], np.float32),  # token mean: -1.125 at ratio 1
    )


def test_tis_on_fresh_on_policy_data_changes_nothing():
    batch = _batch(tiny_model(seed=3))
    plain = GRPOLearner(tiny_model(seed=3), GRPOConfig()).train_step(batch)
    tis = GRPOLearner(tiny_model(seed=3), GRPOConfig(tis_cap=2.0)).train_step(batch)
    assert tis["tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tis["tis_capped_fraction"] == 0.0
    assert tis["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    assert tis["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-3)


def test_tis_weighs_tokens_the_sampler_underrated_up_to_the_cap():
    model = tiny_model(seed=3)
    # The sampler gave every generated token a quarter of the learner's probability.
    batch = _batch(model, behaviour_shift=-math.log(4.0))
    plain = GRPOLearner(tiny_model(seed=3), GRPOConfig()).train_step(_batch(model))
    tis = GRPOLearner(tiny_model(seed=3), GRPOConfig(tis_cap=2.0)).train_step(batch)
    assert tis["tis_weight_mean"] == pytest.approx(2.0, rel=1e-4)
    assert tis["tis_capped_fraction"] == 1.0
    # Ratio 1 to the proximal policy in both runs; the weight doubles the surrogate.
    assert plain["loss"] == pytest.approx(-1.125, rel=1e-4)
    assert tis["loss"] == pytest.approx(2 * plain["loss"], rel=1e-4)


def _step_flops(config: GRPOConfig, batch: GRPOBatch) -> float:
    """FLOPs of the compiled train step, from XLA's cost analysis."""
    learner = GRPOLearner(tiny_model(seed=3), config)
    s = learner.state
    jitted = learner._step.__wrapped__  # the jitted step inside the compile counter
    cost = jitted.lower(s.params, s.opt_state, learner.ref_params, learner.base, batch)
    analysis = cost.compile().cost_analysis()
    return float((analysis[0] if isinstance(analysis, list) else analysis)["flops"])


def test_the_decoupled_objective_runs_no_second_forward():
    """With ``tis_cap`` the ratio's denominator is the learner's own pre-update policy: the
    loss's forward, stopped. A separate "proximal" forward of the same parameters cost
    about a fifth more FLOPs a step (a third more than forward and backward's three)."""
    batch = _batch(tiny_model(seed=3))
    plain = _step_flops(GRPOConfig(mi_pairs=0), batch)
    tis = _step_flops(GRPOConfig(tis_cap=2.0, mi_pairs=0), batch)
    assert tis < 1.05 * plain


@pytest.mark.parametrize("cap", [-1.0, 0.5], ids=["negative", "below_one"])
def test_tis_cap_below_one_is_rejected(cap):
    with pytest.raises(ValueError, match="learner.tis_cap"):
        GRPOConfig(tis_cap=cap)


def _train(config: GRPOConfig, steps: int = 2) -> tuple[list[dict[str, float]], list[np.ndarray]]:
    import jax

    learner = GRPOLearner(tiny_model(), config)
    batch = on_policy_batch(tiny_model())
    batch.loss_mask[1, 20:] = 0.0  # rows of different lengths: the normalisers matter
    metrics = [learner.train_step(batch) for _ in range(steps)]
    return metrics, [np.asarray(x) for x in jax.tree.leaves(learner.params_for_engine())]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"], ids=str)
@pytest.mark.parametrize(
    "extra",
    [{}, {"remat": True}, {"kl_coef": 0.1, "tis_cap": 2.0}],
    ids=["plain", "remat", "kl_and_tis"],
)
def test_micro_batches_and_remat_give_the_whole_batch_update(aggregation, extra):
    base = GRPOConfig(aggregation=aggregation, mi_pairs=0, **extra)
    whole, whole_params = _train(base)
    micro, micro_params = _train(dataclasses.replace(base, micro_batch_rows=1))
    for a, b in zip(whole, micro, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(whole_params, micro_params, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-6)
    assert whole[0]["grad_norm"] > 0  # the step did move the policy


def test_the_learner_splits_a_step_that_would_not_fit_its_memory(monkeypatch, caplog):
    """XLA's memory analysis of the compiled step against what the device has free: a
    step that would not fit runs in smaller micro-batches (the same update), one that
    cannot fit at one row is refused in one line, and a micro-batch size that does not
    divide the rows pads them."""
    import jax

    import tunix_agentic.learners.grpo as grpo
    from tunix_agentic.learners.memory import FREE_SHARE, StepTooLarge, step_bytes

    def train(config):
        learner = GRPOLearner(tiny_model(), config)
        batch = on_policy_batch(tiny_model())
        batch.loss_mask[1, 20:] = 0.0
        metrics = learner.train_step(batch)
        params = [np.asarray(x) for x in jax.tree.leaves(learner.params_for_engine())]
        return learner, metrics, params

    config = GRPOConfig(mi_pairs=0)
    learner, whole, whole_params = train(config)
    _, padded, padded_params = train(dataclasses.replace(config, micro_batch_rows=3))
    assert learner._fitted[(4, 24)][:2] == (4, 4)
    four = step_bytes(learner._fitted[(4, 24)][2])
    monkeypatch.setattr(grpo, "free_bytes", lambda devices: int((four - 1) / FREE_SHARE))
    with caplog.at_level("WARNING", logger="tunix_agentic.learners.memory"):
        split_learner, split, split_params = train(config)
    assert "does not fit the memory free" in caplog.text
    assert split_learner._fitted[(4, 24)][0] < 4  # the temporaries grow with the rows
    for other, params in ((padded, padded_params), (split, split_params)):
        for key in whole:
            assert other[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
        for a, b in zip(whole_params, params, strict=True):
            np.testing.assert_allclose(b, a, atol=2e-6)
    monkeypatch.setattr(grpo, "free_bytes", lambda devices: 1024)
    with pytest.raises(StepTooLarge, match=r"on 4 rows x 24 tokens needs .* GiB even at micro"):
        train(dataclasses.replace(config, micro_batch_rows=1))


def test_every_step_logs_the_sampler_mismatch_and_the_collapse_diagnostic():
    from tunix_agentic.learners.diagnostics import cross_pairs, mi_from_scores

    model = tiny_model()
    learner = GRPOLearner(tiny_model(), GRPOConfig(mi_pairs=4))
    batch = on_policy_batch(model)
    # The diagnostic scores every (prompt j, response i) pair with the policy before the
    # update: recompute it independently with the same model.
    pair_ids, pair_mask = cross_pairs(batch.input_ids, batch.loss_mask, 4, pad_id=0)
    lp = np.asarray(sequence_logprobs(model, pair_ids))
    expected = mi_from_scores((lp * pair_mask[:, 1:]).sum(-1).reshape(4, 4))
    metrics = learner.train_step(batch)
    # On-policy data scored by the same model: no mismatch.
    assert metrics["mismatch_abs_logp_nats"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["mismatch_ratio_p50"] == pytest.approx(1.0, abs=1e-5)
    for key, value in expected.items():
        assert metrics[f"collapse/{key}"] == pytest.approx(value, abs=1e-4), key
    # Identical prompts cannot be told apart: fewer than two distinct prompts, no figure.
    same = batch.replace(input_ids=batch.input_ids.copy())
    same.input_ids[:, :8] = same.input_ids[0, :8]
    assert "collapse/retrieval_accuracy" not in learner.collapse_metrics(same)
    # By default it runs on every 10th step only (a fifth of a small step otherwise).
    logged = [any(k.startswith("collapse/") for k in learner.train_step(batch)) for _ in range(10)]
    assert logged == [False] * 9 + [True]  # steps 1-9 without it, step 10 with it


@pytest.mark.parametrize("estimator", ["k1", "k3"], ids=str)
def test_kl_as_a_reward_penalty_uses_the_configured_estimator(estimator):
    """Sampled by another policy (seed 1), the reference is the learner's start (seed 0):
    each row's advantage loses kl_coef x the summed estimator over its tokens."""
    batch = on_policy_batch(tiny_model(seed=1))
    ref = np.zeros_like(batch.old_logprobs)
    ref[:, 1:] = np.asarray(sequence_logprobs(tiny_model(), batch.input_ids))
    d = (batch.old_logprobs - ref)[:, 1:]
    k = d if estimator == "k1" else np.exp(-d) + d - 1.0
    per_row = (k * batch.loss_mask[:, 1:]).sum(-1)
    config = GRPOConfig(kl_coef=0.1, kl_penalty="reward", kl_estimator=estimator, mi_pairs=0)
    metrics = GRPOLearner(tiny_model(), config).train_step(batch)
    assert metrics["kl_penalty_reward_mean"] == pytest.approx(0.1 * per_row.mean(), rel=1e-4)


def test_overlong_penalty_settings_match_dapo():
    with pytest.raises(ValueError, match="overlong_cache_len"):
        GRPOConfig(overlong="penalty", overlong_max_len=64, overlong_cache_len=0)
    GRPOConfig(overlong="penalty", overlong_max_len=64, overlong_cache_len=64)  # all of it


def test_gspo_with_ppo_sized_clips_warns():
    with pytest.warns(UserWarning, match="trust region"):
        GRPOConfig(loss_type="gspo")
    GRPOConfig(loss_type="gspo", clip_low=3e-4, clip_high=4e-4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("loss_type", "trpo"),
        ("kl_estimator", "k4"),
        ("kl_penalty", "both"),
        ("off_policy_mask", "rows"),
        ("overlong", "truncate"),
        ("dual_clip", 0.5),
        ("micro_batch_rows", -1),
        ("mi_pairs", 1),
        ("mi_every", 0),
        ("length_bucket", 33),
    ],
    ids=lambda v: str(v),
)
def test_bad_learner_settings_are_refused_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=f"learner.{field}"):
        GRPOConfig(**{field: value})


def test_the_train_step_compiles_once_per_batch_shape():
    """Compiles are counted from JAX's compile events (tunix_agentic.compiles), the same
    way as the engine's: one per batch shape, none while tracing is counted twice."""
    learner = GRPOLearner(tiny_model(), GRPOConfig(mi_pairs=0))
    batch = on_policy_batch(tiny_model())
    learner.train_step(batch)
    learner.train_step(batch)
    assert learner.compiles["train_step"] == 1
    wider = batch.replace(
        **{
            name: np.pad(getattr(batch, name), ((0, 0), (0, 8)))
            for name in ("input_ids", "loss_mask", "old_logprobs")
        }
    )
    learner.train_step(wider)
    assert learner.compiles.counts == {"train_step": 2, "pair_scores": 0}


def test_tokens_sampled_under_a_grammar_train_with_the_ratio_and_stay_out_of_the_mismatch():
    """A forced token's recorded logprob is the masked distribution's (here 0: the grammar
    allowed one token). Trained on, its ratio to the learner's own logprob weighs its
    gradient; the mismatch metrics read only the tokens sampled from the policy itself."""
    model = tiny_model()
    batch = on_policy_batch(model)
    forced = np.zeros_like(batch.loss_mask)
    forced[:, 8:12] = 1.0  # each row's first four trained tokens were forced
    old = np.where(forced > 0, 0.0, batch.old_logprobs).astype(np.float32)
    marked = batch.replace(old_logprobs=old, constrained=forced)
    config = GRPOConfig(mi_pairs=0)
    metrics = GRPOLearner(tiny_model(), config).train_step(marked)
    assert metrics["mismatch_abs_logp_nats"] == pytest.approx(0.0, abs=1e-5)
    unmarked = GRPOLearner(tiny_model(), config).train_step(batch.replace(old_logprobs=old))
    assert unmarked["mismatch_abs_logp_nats"] > 0.5  # the masked logprobs, counted as drift
    only = marked.replace(loss_mask=forced)  # every trained token forced: still a gradient
    assert GRPOLearner(tiny_model(), config).train_step(only)["grad_norm"] > 0
    with pytest.raises(ValueError, match="learner.constrained_tokens must be one of"):
        GRPOConfig(constrained_tokens="drop")
