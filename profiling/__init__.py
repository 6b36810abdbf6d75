"""The benchmarks behind the docs' figures: each prints its figures and asserts nothing.

A package, run from the repository root as ``python -m profiling.bench_engine`` (and
likewise every ``bench_*`` module, ``compare_peers``); its modules import each other by
package name, never through ``sys.path``. Shared pieces live in :mod:`profiling.common`
(environments, engines, the peers' model and workload sizes) and :mod:`profiling.pairs`
(interleaved pairs against a peer, the machine guard). ``peers/`` holds the peers' own
scripts, run in their own virtual environments; ``device/`` the prepared accelerator check.
"""
