#!/usr/bin/env bash
# Builds the two Python environments the peer benchmarks run in:
#   $PEERS_WORKDIR/venv        JAX + Tunix (google-tunix pulls flax, optax, transformers, ...)
#   $PEERS_WORKDIR/venv-torch  torch (CPU) + transformers + trl + datasets
# PEERS_WORKDIR defaults to /tmp/peers; PYTHON (python3) makes the venvs. An existing venv
# is reused, so a second run only installs what is missing. Versions seen when the
# figures in docs/performance.md were taken: freeze-venv-jax.txt / freeze-venv-torch.txt here
# (install with `pip install -r` for the same stack).
set -euo pipefail
WORK=${PEERS_WORKDIR:-/tmp/peers}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
[ -x "$WORK/venv/bin/python" ] || "$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet jax flax optax orbax-checkpoint grain
"$WORK/venv/bin/pip" install --quiet google-tunix
[ -x "$WORK/venv-torch/bin/python" ] || "$PY" -m venv "$WORK/venv-torch"
# torch first, on its own: a CPU build, so that trl/accelerate do not pull a CUDA one
# (TORCH_SPEC picks another build or version; on these machines 2.13.0 is a local wheel).
"$WORK/venv-torch/bin/pip" install --quiet "${TORCH_SPEC:-torch==2.13.0}" \
  || "$WORK/venv-torch/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu
"$WORK/venv-torch/bin/pip" install --quiet transformers trl datasets
"$WORK/venv/bin/python" -c "import jax, tunix; print('venv:', 'jax', jax.__version__, 'tunix', tunix.__version__)"
"$WORK/venv-torch/bin/python" -c "import torch, transformers, trl; print('venv-torch:', 'torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
