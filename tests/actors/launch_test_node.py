"""supervisor.py with one more role, "test": no actors of its own (only the config file's
[[actor]] tables) and a recovery hook that leaves a trace, to test node restarts."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the actor processes import tests.support.actors

from smartgo.actors.arbiter import main  # noqa: E402
from smartgo.actors.role import Role  # noqa: E402
from smartgo.node.roles import ROLES  # noqa: E402

TEST_ROLES = {**ROLES, "test": Role("test", 0, lambda config: [], recover="tests.support.actors:record_recovery")}

if __name__ == "__main__":
    sys.exit(main(TEST_ROLES))
