"""The command line: ``tunix-agentic`` and its commands (``main.py``), and the generated
reference pages of the docs site (``python -m tunix_agentic.cli.reference``)."""
