"""Keep JAX quietly on the CPU where a TPU runtime is installed but no TPU is attached.

With the ``tpu`` extra (libtpu) installed, JAX loads the TPU runtime when it first looks
for devices, and on a machine without a TPU the runtime prints five lines (``Failed to
find host bounds``, ``E0000 ... INVALID_ARGUMENT ... TPU_WORKER_HOSTNAMES``) that look
like a crash before JAX falls back to the CPU. :func:`keep_jax_off_absent_tpu` sets
``JAX_PLATFORMS=cpu`` for a CLI command when nothing else could be used: libtpu installed,
no TPU on the PCI bus (Google's vendor id, as JAX's own check reads it) nor under
``/dev/accel*``, no GPU plugin installed, and the user chose no platform. ``aot`` keeps
the TPU runtime: it compiles for a TPU that is not there. No JAX is imported here.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path

GOOGLE_PCI_VENDOR = "0x1ae0"


def tpu_attached() -> bool:
    """Whether this machine shows a TPU: a Google PCI device or a ``/dev/accel*`` node."""
    if glob.glob("/dev/accel*"):
        return True
    for vendor in Path("/sys/bus/pci/devices").glob("*/vendor"):
        try:
            if vendor.read_text().strip().lower() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def gpu_plugin_installed() -> bool:
    """Whether a JAX GPU plugin (CUDA or ROCm) is installed (its devices are JAX's to find)."""
    try:
        import jax_plugins  # type: ignore[import-not-found]  (a namespace package)
    except ImportError:
        return False
    names = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    return any("cuda" in n or "rocm" in n for n in names)


def keep_jax_off_absent_tpu(command: str) -> bool:
    """Set ``JAX_PLATFORMS=cpu`` when the CPU is the only platform JAX could use and the
    TPU runtime would otherwise print its errors (see the module docstring); whether it
    did. Only before JAX is imported, and never for ``aot``."""
    if command == "aot" or "JAX_PLATFORMS" in os.environ or "jax" in sys.modules:
        return False
    if importlib.util.find_spec("libtpu") is None or tpu_attached() or gpu_plugin_installed():
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True
