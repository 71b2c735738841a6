"""SmartGo node entry point: `python supervisor.py --role master|slave|registry [...]` (see --help).

The supervisor itself lives in smartgo/actors/arbiter.py and the role table in smartgo/node/roles.py;
this file only keeps the documented command working from a checkout.
"""

import sys

from smartgo.node import main

if __name__ == "__main__":
    sys.exit(main())
