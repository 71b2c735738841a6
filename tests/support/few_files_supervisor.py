"""supervisor.py under a hard open-files limit of FILES (1,024), as a host with the usual default
gives it: a test of what the node does at its descriptor limits needs no million connections."""

from __future__ import annotations

import resource
import runpy
import sys
from pathlib import Path

FILES = 1024

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))
    supervisor = Path(__file__).resolve().parents[2] / "supervisor.py"
    sys.argv[0] = str(supervisor)
    runpy.run_path(str(supervisor), run_name="__main__")
