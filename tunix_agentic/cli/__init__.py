"""The command line: ``tunix-agentic train``, ``export`` and ``serve-engine`` (``main.py``)."""
