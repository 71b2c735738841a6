"""`python -m smartgo.cli ...` runs the `smartgo` command."""

import sys

from smartgo.cli.main import main

sys.exit(main())
