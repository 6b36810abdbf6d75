"""The peer benchmarks' machine guard (tunix_agentic/compare/machine.py), the floor
arithmetic (tunix_agentic/compare/floor.py) and how the peer benchmarks judge pairs
(profiling/pairs.py)."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tunix_agentic.compare.floor import (
    MachinePeak,
    ModelShape,
    decode_floor_s,
    forward_flops,
    grpo_step_floor,
    train_flops,
)
from tunix_agentic.compare.machine import (
    BUSY_SUMMARY,
    BusyGuard,
    CpuSnapshot,
    MachineState,
    Window,
    busy_ticks,
    own_ticks,
    parse_threads,
    peer_env,
    threads_line,
    xla_threads,
)

PROFILING = Path(__file__).resolve().parents[1] / "profiling"


@pytest.fixture
def peers():
    """The pair machinery of the peer benchmarks (``profiling.pairs``)."""
    return importlib.import_module("profiling.pairs")


# ------------------------------------------------------------------ /proc
def test_busy_ticks_count_every_non_idle_field():
    stat = "cpu  100 5 20 9000 40 3 2 7 11 0\ncpu0 50 2 10 4500 20 1 1 3 5 0\nintr 1\n"
    assert busy_ticks(stat) == 100 + 5 + 20 + 3 + 2 + 7  # idle, iowait, guest left out


def test_own_ticks_read_past_a_command_name_with_spaces_and_parens():
    # pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ...
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "300", "40", "25", "5"]
    stat = "4242 (my (odd) bench) " + " ".join(fields) + " 20 0 1 0\n"
    assert own_ticks(stat) == 300 + 40 + 25 + 5


def test_others_share_is_machine_time_less_our_own():
    a = CpuSnapshot(wall=10.0, machine_busy_s=100.0, own_s=20.0, load1=0.5)
    b = CpuSnapshot(wall=14.0, machine_busy_s=106.0, own_s=22.0, load1=1.5)
    s = MachineState.between(a, b, cpus=2)
    assert (s.wall_s, s.own_cpu_s, s.other_cpu_s) == (4.0, 2.0, 4.0)
    assert s.other_share == 0.5  # 4 CPU-s of 8
    assert s.to_dict()["load_end"] == 1.5
    # Tick rounding can put our own time a hair above the machine's: never negative.
    quiet = MachineState.between(a, CpuSnapshot(11.0, 101.0, 21.02, 0.5), cpus=2)
    assert quiet.other_cpu_s == 0.0


def test_a_waited_for_child_counts_as_our_own_cpu_time():
    burn = "import time\nwhile time.process_time() < 0.3: pass"
    with Window() as w:
        subprocess.run([sys.executable, "-c", burn], check=True)
    # The child burned >= 0.3 CPU-s; /proc counts in ticks (10 ms), hence the margin.
    assert w.state.own_cpu_s >= 0.25
    assert w.state.other_cpu_s >= 0 and w.state.cpus >= 1


# ------------------------------------------------------------------ guard
def _state(share: float, wall: float = 10.0, cpus: int = 2) -> MachineState:
    return MachineState(
        wall, cpus, own_cpu_s=wall, other_cpu_s=share * wall * cpus, load_start=0.1, load_end=0.2
    )


@pytest.mark.parametrize(
    "share,busy", [(0.05, False), (0.10, False), (0.11, True), (0.9, True)], ids=str
)
def test_a_pair_is_busy_past_the_share(share, busy):
    assert BusyGuard(0.10).is_busy(_state(share)) is busy


@pytest.mark.parametrize(
    "field,value",
    [("max_other_share", 0.0), ("max_other_share", 1.5), ("min_clean_pairs", 0)],
    ids=["zero-share", "share-over-one", "no-pairs"],
)
def test_guard_rejects_bad_settings(field, value):
    with pytest.raises(ValueError, match=field):
        BusyGuard(**{field: value})


def _measured(peers, rows):
    """(ours s/step, theirs s/step, others' share) -> measured pairs with threads recorded."""
    return [
        (
            peers.Measurement(o, f"ours {o}", {"threads": {"intra_op": 2}}),
            peers.Measurement(t, f"theirs {t}", {"threads": {"intra_op": 2}}),
            _state(share),
        )
        for o, t, share in rows
    ]


def test_busy_pairs_are_marked_and_left_out_of_the_median(peers):
    rows = [(1.0, 1.2, 0.02), (1.0, 18.0, 0.45), (1.0, 1.4, 0.05), (1.0, 1.3, 0.0)]
    c = peers.judge_pairs(
        "ours / trl",
        _measured(peers, rows),
        unit="s/step",
        higher_is_better=False,
        guard=BusyGuard(0.10, 2),
        floor=0.5,
    )
    assert c.stands and c.busy == 1 and c.ratios == (1.2, 1.4, 1.3)
    assert c.median == 1.3 and c.busy_ratios == (18.0,)
    assert [s["busy"] for s in c.states] == [False, True, False, False]
    line = c.line()
    assert (
        line.startswith("RATIO ours / trl: median 1.30x")
        and "1 busy pair(s) left out (others used 45%" in line
    )
    s = c.summary()
    assert s["verdict"] == "ok" and s["busy"] == 1 and s["median_ratio"] == 1.3
    assert s["threads"] == {"ours": {"intra_op": 2}, "theirs": {"intra_op": 2}}
    # Floor ratio of each side's median s/step over the 0.5 s floor (clean pairs only).
    assert c.floor_ratios() == {"ours": 2.0, "theirs": 2.6}
    assert "floor ratio ours 2.00x, theirs 2.60x" in c.floor_line()


def test_too_few_clean_pairs_is_no_comparison(peers):
    rows = [(1.0, 11.0, 0.5), (1.0, 19.0, 0.3)]
    c = peers.judge_pairs(
        "ours / trl",
        _measured(peers, rows),
        unit="s/step",
        higher_is_better=False,
        guard=BusyGuard(0.10, 2),
        floor=0.5,
    )
    assert not c.stands and c.median is None and c.busy == 2 and c.ratios == ()
    assert c.line().startswith(f"BUSY ours / trl: {BUSY_SUMMARY}: 2 busy pair(s)")
    assert "RATIO" not in c.line() and "not a result: 11.00, 19.00" in c.line()
    s = c.summary()
    assert s["verdict"] == BUSY_SUMMARY and s["median_ratio"] is None and s["min_ratio"] is None
    # One clean pair of three is still too few (2 needed) ...
    one = peers.judge_pairs(
        "x",
        _measured(peers, [(1.0, 1.2, 0.0), *rows]),
        unit="s/step",
        higher_is_better=False,
        guard=BusyGuard(0.10, 2),
    )
    assert not one.stands and one.ratios == (1.2,) and one.median is None
    # ... but a single requested pair that ran clean stands, and no guard leaves all in.
    single = peers.judge_pairs(
        "x",
        _measured(peers, [(1.0, 1.2, 0.0)]),
        unit="s/step",
        higher_is_better=False,
        guard=BusyGuard(0.10, 2),
    )
    assert single.stands and single.median == 1.2
    unguarded = peers.judge_pairs(
        "x", _measured(peers, rows), unit="s/step", higher_is_better=False
    )
    assert unguarded.stands and unguarded.ratios == (11.0, 19.0)


def test_a_pair_without_a_figure_is_dropped_not_busy(peers):
    rows = [(1.0, None, 0.0), (1.0, 1.5, 0.0)]
    c = peers.judge_pairs(
        "x", _measured(peers, rows), unit="s/step", higher_is_better=False, guard=BusyGuard()
    )
    assert c.stands and c.dropped == 1 and c.busy == 0 and c.ratios == (1.5,)


# ---------------------------------------------------------------- threads
def test_peer_env_gives_both_runtimes_the_same_threads_and_a_wait_policy():
    env = peer_env(2, "passive")
    assert env == {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "NPROC": "2",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    assert "OMP_WAIT_POLICY" not in peer_env(None, "default")
    assert xla_threads({"NPROC": "3"}).intra_op == 3
    assert xla_threads({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}).intra_op == 1
    with pytest.raises(ValueError, match="wait_policy"):
        peer_env(2, "spin")


def test_threads_line_round_trips_through_a_process_output():
    line = threads_line(xla_threads({"NPROC": "2"}))
    got = parse_threads(f"noise\n{line}\nRESULT x: 1 s/step\n")
    assert got["intra_op"] == 2 and got["source"] == "NPROC" and got["env"] == {"NPROC": "2"}
    assert parse_threads("RESULT only\n") is None


def test_a_peer_script_prints_its_thread_settings(tmp_path):
    """toy_common.print_threads (the peer scripts' line) read back by parse_threads."""
    code = "import toy_common; toy_common.print_threads('jax')\n"  # as a peer script does
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROFILING / "peers",  # -c puts it first on sys.path, as a peer script's folder
        capture_output=True,
        text=True,
        env={"NPROC": "3", "PATH": ""},
        check=True,
    ).stdout
    assert parse_threads(out) == {
        "side": "jax",
        "env": {"NPROC": "3"},
        "intra_op": 3,
        "source": "NPROC",
    }


# ------------------------------------------------------------------ floor
# The peers' toy decoder: 4 layers, d 256, 4 heads / 2 KV heads of 64, vocab 2048, tied.
TOY = ModelShape(4_459_264, 2048, 256, 4, 4, 2, 64)


def test_the_toy_param_count_matches_our_model(peers):
    from flax import nnx

    from tunix_agentic.models.transformer import Transformer, count_params

    cfg = importlib.import_module("profiling.bench_rl_workload").peer_model_config()
    assert peers.toy_shape() == TOY
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))  # no weights made
    assert count_params(abstract) == TOY.params


def test_train_flops_are_six_params_per_token_plus_attention():
    # Forward per token: 2 x 4,459,264 + 4 x 4 layers x 4 heads x 64 x 96 = 8,918,528 + 393,216.
    assert forward_flops(TOY, 16, 96) == 16 * 96 * 9_311_744
    assert train_flops(TOY, 16, 96) == 3 * 16 * 96 * 9_311_744  # 6 x params + attention
    assert train_flops(TOY, 16, 96, remat=True) == 4 * 16 * 96 * 9_311_744  # 8x with remat
    assert train_flops(TOY, 16, 96, ref=True) == 57_211_355_136  # + the reference forward
    untied = ModelShape(100, 10, 4, 1, 1, 1, 4, tied=False)
    assert forward_flops(untied, 1, 1) == 2 * (100 - 40) + 4 * 4  # the input lookup is free


def test_decode_floor_is_a_roofline_of_weights_and_kv_reads():
    # KV per token: 2 x 4 layers x 2 heads x 64 x 4 bytes = 4,096; weights 17,837,056 bytes.
    assert (TOY.kv_bytes_per_token, TOY.weight_bytes) == (4096, 17_837_056)
    slow_memory = decode_floor_s(TOY, 16, 32, 2, flops_per_s=1e15, bytes_per_s=1e9)
    assert slow_memory == pytest.approx((2 * 17_837_056 + 16 * (32 + 33) * 4096) / 1e9)
    slow_math = decode_floor_s(TOY, 1, 10, 1, flops_per_s=1e6, bytes_per_s=1e15)
    assert slow_math == pytest.approx((2 * 4_459_264 + 4 * 4 * 4 * 64 * 10) / 1e6)


def test_grpo_step_floor_adds_its_parts_and_checks_the_issue_arithmetic():
    peak = MachinePeak(flops_per_s=150e9, bytes_per_s=16e9)
    f = grpo_step_floor(TOY, peak, rows=16, prompt=32, new=64, train_length=96, ref=True)
    assert f.train_s == pytest.approx(57_211_355_136 / 150e9)  # 0.381 s
    assert f.sync_s == pytest.approx(2 * 17_837_056 / 16e9)
    assert f.total_s == pytest.approx(f.prefill_s + f.decode_s + f.train_s + f.sync_s)
    # By hand: prefill 512 tokens x (8,918,528 + 4,096 x 32) / 150e9 = 30.89 ms; decode
    # memory-bound every step, (64 x 17,837,056 + 16 x 4,096 x 4,064) bytes / 16e9 = 87.99 ms;
    # train 381.41 ms; sync 2.23 ms: 502.5 ms. Issue 39's 0.70 s step is 1.39x this floor.
    assert f.prefill_s == pytest.approx(0.030889, rel=1e-4)
    assert f.decode_s == pytest.approx(0.087994, rel=1e-4)
    assert f.total_s == pytest.approx(0.502523, rel=1e-4)
    assert f.ratio(0.70) == pytest.approx(1.393, rel=1e-3)
    with pytest.raises(ValueError, match="flops_per_s"):
        MachinePeak(0.0, 1.0)


# ---------------------------------------------------------- compare report
def test_compare_report_says_busy_for_timing_rows_and_stamps_its_table(tmp_path):
    from tunix_agentic.compare.mapping import trl_mapping
    from tunix_agentic.compare.parity import LossParity
    from tunix_agentic.compare.report import CompareResult, write_report
    from tunix_agentic.compare.run import machine_record
    from tunix_agentic.compare.stamp import find, parse
    from tunix_agentic.config import load_config

    def side(step_s, share):
        steps = [
            {"step": 1, "reward_mean": 0.5, "step_s": step_s, "wait_for_batch_s": 0.1,
             "train_s": 1.0, "weight_sync_s": 0.1, "generation_s": 1.0, "reward_s": 0.0,
             "generated_tokens": 80.0, "tokens_per_s": 80.0 / step_s}
        ]  # fmt: skip
        state = _state(share).to_dict()
        return {"steps": steps, "peak_rss_mb": 1.0, "wall_s": 10.0, "machine": state,
                "threads": {"intra_op": 2}}  # fmt: skip

    ours, trl = side(2.0, 0.02), side(18.0, 0.45)
    record = machine_record(ours, trl, BusyGuard(0.10), threads=2, omp_wait_policy="passive")
    assert "machine" not in ours and record["verdict"] == BUSY_SUMMARY
    assert "45% of the CPUs during trl's run" in record["why"]
    result = CompareResult(
        config="run.yaml", model="m", steps=1,
        mapping=trl_mapping(load_config("configs/calculator_tiny.yaml", [])),
        ours=ours, trl=trl, parity={"probe": LossParity(0.1, 0.1, True, ())},
        multi_turn=False, out_dir=str(tmp_path), machine=record,
        command="tunix-agentic compare --config run.yaml --against trl",
    )  # fmt: skip
    md = write_report(result, tmp_path)["md"].read_text()
    assert f"**{BUSY_SUMMARY}** for the timing rows" in md
    assert "| seconds per step (after the first) | 2.000 | 18.000 | busy |" in md
    assert "| mean reward over steps | 0.500 | 0.500 | 1.00x |" in md  # not a timing row
    ((_, comment),) = find(md)
    assert parse(comment).command.startswith("tunix-agentic compare --config run.yaml")
    quiet = machine_record(side(2.0, 0.0), side(3.0, 0.05), BusyGuard(0.10), 2, "passive")
    assert quiet["verdict"] == "ok" and quiet["side_threads"]["trl"] == {"intra_op": 2}
