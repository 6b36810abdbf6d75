#!/usr/bin/env bash
# Every peer benchmark 3 times, each run a fresh process; logs in $ANCHOR_LOGDIR
# (/tmp/peers/logs). Needs the venvs of setup_venvs.sh. About 8 minutes on 2 cores.
# These are the peers alone; profiling/compare_peers.py, bench_learner.py and
# bench_rl_workload.py measure ours beside them as interleaved pairs.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
JAX_PY=${ANCHOR_JAX_PY:-/tmp/peers/venv/bin/python}
TORCH_PY=${ANCHOR_TORCH_PY:-/tmp/peers/venv-torch/bin/python}
LOG=${ANCHOR_LOGDIR:-/tmp/peers/logs}
mkdir -p "$LOG"
bench() {  # name python script [VAR=value ...]
  local name=$1 py=$2 script=$3
  shift 3
  for i in 1 2 3; do
    env "$@" timeout 600 "$py" "$HERE/$script" >"$LOG/$name.$i.log" 2>&1
    echo "[$name #$i rc=$?] $(grep '^RESULT' "$LOG/$name.$i.log" || tail -n 1 "$LOG/$name.$i.log")"
  done
}
bench tunix_sampler_greedy "$JAX_PY" bench_tunix_sampler.py ANCHOR_SAMPLING=greedy
bench tunix_sampler_top_p "$JAX_PY" bench_tunix_sampler.py ANCHOR_SAMPLING=top_p
bench hf_generate_greedy "$TORCH_PY" bench_hf_generate.py ANCHOR_SAMPLING=greedy
bench hf_generate_top_p "$TORCH_PY" bench_hf_generate.py ANCHOR_SAMPLING=top_p
bench tunix_grpo "$JAX_PY" bench_tunix_grpo.py
bench trl_grpo "$TORCH_PY" bench_trl_grpo.py
bench tunix_rl "$JAX_PY" bench_tunix_rl.py
bench hf_rl "$TORCH_PY" bench_hf_rl.py
