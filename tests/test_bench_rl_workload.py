"""profiling/bench_rl_workload.py's workload (profiling/peers/toy_common.py): the token
counts it states, the prompt sharing it relies on, and its flags; no peer venv needed."""

import importlib

import pytest


@pytest.fixture
def mods():
    return (
        importlib.import_module("profiling.peers.toy_common"),
        importlib.import_module("profiling.bench_rl_workload"),
    )


def test_default_workload_has_the_stated_token_counts(mods):
    tc, _ = mods
    w = tc.RLWorkload()
    assert w.episodes == 64
    assert w.prompt_lengths() == [320, 416, 512]  # BOS + 299 system + 20 task, then +64 +32
    assert w.final_length == 576
    assert w.generated_tokens == 64 * 3 * 64
    assert w.resend_prefill_tokens() == 64 * (320 + 416 + 512)
    firsts = w.first_prompts(seed=1)
    assert [len(p) for p in firsts] == [320] * 64
    assert len(w.observation(1, 0, 0)) == 32
    ids = {i for p in firsts for i in p[1:]} | set(w.observation(1, 5, 1))
    assert firsts[0][0] == tc.BOS_ID and min(ids) >= tc.FIRST_WORD and max(ids) < 2048


def test_prompts_share_the_system_prompt_and_a_task_shares_its_message(mods):
    tc, _ = mods
    w = tc.RLWorkload(tasks=3, group=2)
    p = w.first_prompts(seed=7)
    assert p[0] == p[1] and p[2] == p[3]  # a task's G samples: one prompt
    assert p[0][:300] == p[2][:300] == p[4][:300]  # every task: one system prompt
    assert p[0][300:] != p[2][300:]
    assert w.observation(7, 0, 0) != w.observation(7, 1, 0)  # each episode its own tool output
    assert w.first_prompts(seed=8)[0][1:300] != p[0][1:300]  # a new step: new ids


def test_workload_goes_to_the_peers_through_the_environment(mods, monkeypatch):
    tc, _ = mods
    w = tc.RLWorkload(tasks=2, group=3, system_tokens=10, task_tokens=4, new_tokens=5)
    for name, value in tc.rl_workload_env(w).items():
        monkeypatch.setenv(name, value)
    assert tc.rl_workload_from_env() == w


@pytest.mark.parametrize(
    "field", ["tasks", "group", "turns", "obs_tokens"], ids=["tasks", "group", "turns", "obs"]
)
def test_workload_rejects_a_non_positive_field(mods, field):
    tc, _ = mods
    with pytest.raises(ValueError, match=f"RLWorkload.{field} must be >= 1"):
        tc.RLWorkload(**{field: 0})


def test_our_model_matches_the_peers_dims(mods):
    _, bench = mods
    assert bench.peer_model_config() == importlib.import_module("profiling.common").PEER_DIMS


@pytest.mark.parametrize(
    "argv",
    [["--pairs", "0"], ["--rounds", "0"], ["--peers", "vllm"], ["--torch-threads", "0"]],
    ids=["zero-pairs", "zero-rounds", "unknown-peer", "zero-threads"],
)
def test_bench_rl_workload_rejects_bad_flags(mods, argv, capsys):
    _, bench = mods
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert argv[0] in capsys.readouterr().err
