"""The linter and the type checker, run as part of the suite (CI runs the suite: see .ci/run).

What they check and how strictly is configured in pyproject.toml ([tool.ruff], [tool.mypy]): the
scope, the rule set, and the stricter settings for net and the actor runtime. Both run the way a
developer runs them, from the repository root, so a finding here reproduces with the same command.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<rest>.*)$")
_EXPLAINED = re.compile(r"^\[[-a-z, ]+\]\s+#\s*\S")  # a code, then `# why`


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(300)
def test_ruff_finds_nothing():
    done = _run("ruff", "check", "--no-fix", "--output-format", "concise", timeout=240)
    assert done.returncode == 0, f"`python -m ruff check` found problems:\n{done.stdout}{done.stderr}"


@pytest.mark.timeout(600)
def test_mypy_finds_nothing():
    done = _run("mypy", timeout=540)    # files and settings: pyproject.toml [tool.mypy]
    assert done.returncode == 0, f"`python -m mypy` found problems:\n{done.stdout}{done.stderr}"


def test_every_type_ignore_says_why_on_its_line():
    bare = []
    for path in sorted([*ROOT.glob("smartgo/**/*.py"), *ROOT.glob("analytics/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found = _IGNORE.search(line)
            if found and not _EXPLAINED.match(found["rest"]):
                bare.append(f"{rel}:{n}: {line.strip()}")
    assert not bare, "a `# type: ignore[code]` without `# why` after it:\n" + "\n".join(bare)
