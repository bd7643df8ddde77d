"""Every ```python block of README.md runs (in order, each in a fresh namespace), and the
README stays short: a pitch, the quick start, one example and links (the docs hold the rest)."""

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
    assert len(_blocks()) >= 1


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_block_runs(index):
    code = _blocks()[index]
    exec(compile(code, f"<README.md python block {index}>", "exec"), {"__name__": "__readme__"})


def test_readme_is_short_and_names_papers_in_full():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 10_500, len(text.encode("utf-8"))
    assert "seed 00" not in text.lower() and "issue " not in text.lower()
    assert "Sensors 22" in text and "Journal of Nonlinear Science" in text
