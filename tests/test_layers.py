"""DESIGN.md's "Layers" section names every module of the package (the layers themselves are held
by `lint-imports`, which `make test` runs first: the contracts are in pyproject.toml)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_table() -> set[str]:
    """The files the module table of DESIGN.md's "Layers" names: its first column, where a name
    without a folder is in the folder of the name before it in the same cell."""
    text = (ROOT / "DESIGN.md").read_text()
    section = text[text.index("\n## Layers\n") : text.index("\n## ", text.index("\n## Layers\n") + 1)]
    table = section[section.index("| module | holds |") :]
    named = set()
    for row in re.findall(r"^\| (.+?) \|", table, re.M)[2:]:
        folder = ""
        for name in re.findall(r"`([^`]+)`", row):
            folder = name.rpartition("/")[0] + "/" if "/" in name else folder
            named.add(name if "/" in name else folder + name)
    return named


def test_the_module_table_of_design_md_names_every_module_of_the_package():
    package = ROOT / "filechannel"
    modules = {str(p.relative_to(package)) for p in package.rglob("*") if p.suffix in (".py", ".c")}
    named = _module_table()
    assert modules - named == set(), "modules DESIGN.md's module table (section Layers) does not name"
    assert named - modules == set(), "names in DESIGN.md's module table that are no module"
