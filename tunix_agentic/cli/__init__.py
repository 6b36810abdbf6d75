"""The command line: ``tunix-agentic train`` and ``tunix-agentic serve-engine`` (``main.py``)."""
