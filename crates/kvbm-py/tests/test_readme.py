"""The READMEs' Python examples run as written."""

import pathlib
import re

import pytest

CRATE = pathlib.Path(__file__).resolve().parents[1]
READMES = [CRATE / "README.md", CRATE.parents[1] / "README.md"]


def python_blocks(path):
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(CRATE.parents[1])))
def test_readme_examples_run(readme):
    blocks = python_blocks(readme)
    assert blocks, f"no Python example in {readme}"
    for block in blocks:
        exec(compile(block, str(readme), "exec"), {})
