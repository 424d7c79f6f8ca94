"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", text, re.S)
    assert block, "README has no Quick start bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    """Exactly two commands; .ci/run contains the test command verbatim."""
    commands = _quick_start()
    assert len(commands) == 2
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
    # the install keeps the user's torch: no command pins (and so replaces) it
    assert all(c.startswith("pip install -e ") and "torch==" not in c for c in commands)


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_python_blocks_run():
    """Every python block of the README runs: doctest blocks (``>>>``) must print what
    they show; the others must run without error, each in a fresh namespace."""
    import doctest

    import torch

    import fxquant

    blocks = _python_blocks()
    assert len(blocks) >= 2  # a quantization example and a lint example
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(
        optionflags=doctest.NORMALIZE_WHITESPACE)
    for i, block in enumerate(blocks):
        if ">>>" in block:
            test = parser.get_doctest(block, {"torch": torch, "fxquant": fxquant},
                                      f"README block {i}", "README.md", 0)
            result = runner.run(test)
            assert result.failed == 0, f"README block {i} prints something else"
        else:
            exec(compile(block, f"README block {i}", "exec"), {"__name__": "readme"})
