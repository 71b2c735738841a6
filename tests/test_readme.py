"""The README's two set-up commands are the contract with users and CI."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```", 2)[1]
    lines = [ln.strip() for ln in block.splitlines()[1:] if ln.strip() and not ln.strip().startswith("#")]
    return lines


def test_readme_opens_with_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2, cmds
    run, test = cmds
    assert "supervisor.py" in run or "smartgo" in run
    assert "pytest" in test


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()
