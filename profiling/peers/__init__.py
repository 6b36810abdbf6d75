"""The peers' side of the comparisons: scripts run as ``python profiling/peers/NAME.py`` in
the peers' own virtual environments (see README.md here), beside our benchmarks in
``profiling``; ``toy_common`` (the model, the tokenizer and the workloads, standard library
only) is imported by both sides."""
