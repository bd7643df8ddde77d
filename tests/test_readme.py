"""Every ```python block of README.md runs (in order, each in a fresh namespace)."""

import pathlib
import re

import matplotlib
import pytest

matplotlib.use("Agg")

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def _blocks():
    return _FENCE.findall(README.read_text(encoding="utf-8"))


def test_readme_has_examples():
    assert len(_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_block_runs(index):
    code = _blocks()[index]
    exec(compile(code, f"<README.md python block {index}>", "exec"), {"__name__": "__readme__"})
