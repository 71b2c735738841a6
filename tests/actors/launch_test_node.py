"""supervisor.py with one more role, "test": no actors of its own (only the config file's
[[actor]] tables) and a recovery hook that leaves a trace, to test node restarts."""

import sys

from smartgo.actors.arbiter import main
from smartgo.actors.role import Role
from smartgo.node.roles import ROLES

TEST_ROLES = {**ROLES, "test": Role("test", 0, lambda config: [], recover="smartgo.actors.testing_actors:record_recovery")}

if __name__ == "__main__":
    sys.exit(main(TEST_ROLES))
