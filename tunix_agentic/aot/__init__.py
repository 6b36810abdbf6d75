"""Ahead-of-time compilation of a run for a TPU topology that is not present.

From the run's config and the model's ``config.json`` alone (no weights, no tokenizer),
:func:`run_programs` compiles the learner's train step, the SFT step, the engine's prefill
and decode and the weight sync for a topology libtpu describes (``v5e:2x4``), and reports
each program's bytes per chip against the chip's HBM, its FLOPs and bytes accessed, its
roofline time at the chip's peak (:mod:`.chips`), the kernels it calls and its waste.
``tunix-agentic aot`` (:mod:`.cli`) is the command line.
"""

from tunix_agentic.lazy import lazy_exports

_EXPORTS = {
    "CHIPS": "tunix_agentic.aot.chips",
    "Chip": "tunix_agentic.aot.chips",
    "AotReport": "tunix_agentic.aot.compile",
    "ProgramReport": "tunix_agentic.aot.compile",
    "compile_programs": "tunix_agentic.aot.compile",
    "run_programs": "tunix_agentic.aot.compile",
    "AotError": "tunix_agentic.aot.topology",
    "Topology": "tunix_agentic.aot.topology",
    "get_topology": "tunix_agentic.aot.topology",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
