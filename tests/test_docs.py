"""The documentation: its code runs, it covers every public name and rule, each result page
names its command, and the README and the package description stay short and self-contained."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest
import torch

import fxquant
from fxquant.linter.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "source"
PAGES = sorted(SOURCE.rglob("*.md"))


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)],
                         ids=lambda p: str(p.relative_to(SOURCE)))
def test_page_code_runs(page):
    """Every python block of the page runs in a fresh namespace; ``>>>`` blocks print what
    they show."""
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    for i, block in enumerate(_blocks(page)):
        torch.manual_seed(0)
        if ">>>" in block:
            test = parser.get_doctest(block, {"torch": torch, "fxquant": fxquant},
                                      f"{page.name} block {i}", str(page), 0)
            assert runner.run(test).failed == 0, f"{page.name} block {i} prints something else"
        else:
            exec(compile(block, f"{page.name} block {i}", "exec", dont_inherit=True),
                 {"__name__": "docs"})


def test_every_public_name_is_in_the_api_reference():
    """Each name of fxquant.__all__ and fxquant.recipes.__all__ has an autodoc entry."""
    api = (SOURCE / "api.md").read_text()
    documented = set(re.findall(r"\.\. auto\w+:: ([\w.]+)", api))
    missing = [f"fxquant.{n}" for n in fxquant.__all__ if f"fxquant.{n}" not in documented
               and n != "recipes"]
    missing += [f"fxquant.recipes.{n}" for n in fxquant.recipes.__all__
                if f"fxquant.recipes.{n}" not in documented]
    assert "fxquant.recipes" in documented
    assert not missing


def test_every_lint_rule_is_in_the_rule_table():
    """The concepts page lists every rule with its severity."""
    page = (SOURCE / "concepts" / "lint-rules.md").read_text()
    rows = dict(re.findall(r"^\| (FXQ\d{3}) \| [\w-]+ \| (\w+) \|", page, re.M))
    assert rows == {rule.id: rule.severity for rule in RULES.values()}


@pytest.mark.parametrize("page", sorted((SOURCE / "results").glob("*.md")),
                         ids=lambda p: p.name)
def test_each_result_page_names_its_command(page):
    """A result page shows the command that makes its numbers."""
    if page.name == "index.md":
        return
    commands = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    assert any("python" in block for block in commands)


def test_readme_is_a_short_user_guide():
    """At most 200 lines, about the project only, no path outside the repository."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for phrase in ("the issue", "this round", "this session"):
        assert phrase not in text.lower()
    outside = [line for line in text.splitlines() if "../" in line
               and "FXQUANT_DATA" not in line]
    assert not outside


def test_package_description_has_no_relative_links():
    """The description a package index shows: absolute links only."""
    text = (ROOT / "docs" / "package.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all(re.match(r"https?://", link) for link in links)
    assert "docs/package.md" in (ROOT / "pyproject.toml").read_text()


def test_version_is_one_number_everywhere():
    """fxquant.__version__, the CLI and the changelog's newest entry agree."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fxquant", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == f"fxquant {fxquant.__version__}"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.M).group(1) == fxquant.__version__
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "fxquant" / "py.typed").exists()


def test_readme_api_table_lists_every_exported_name():
    """The README's API table names each entry of fxquant.__all__."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## API"):text.index("## Documentation")]
    assert not [n for n in fxquant.__all__ if not re.search(rf"\b{n}\b", table)]
