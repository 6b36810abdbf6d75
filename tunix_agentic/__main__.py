"""``python -m tunix_agentic``: the command line (same as ``tunix-agentic``)."""

import sys

from tunix_agentic.cli.main import main

sys.exit(main())
