import sys

from tunix_agentic.cli.main import main

sys.exit(main())
