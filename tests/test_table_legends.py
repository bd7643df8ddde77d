"""Every column of every experiment's summary table has a legend line (what it means),
printed under the table by `geomjax reproduce` and stored in the JSON under "columns".

The columns are read from the summary tables the documentation's figures were made with
(docs/figures/NAME/summary.json, one per experiment) and from a run of the CLI."""

import json
import pathlib

import pytest

from geomjax.experiments import experiments
from geomjax.experiments._columns import format_legend, legend, missing_legends

FIGURES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "figures"


@pytest.mark.parametrize("name", experiments())
def test_every_summary_column_has_a_legend(name):
    summary_file = FIGURES / name / "summary.json"
    if not summary_file.exists():
        pytest.skip(f"no stored summary for {name} (python docs/generate_figures.py {name})")
    rows = json.loads(summary_file.read_text(encoding="utf-8"))["summary"]
    assert rows, name
    assert missing_legends(rows) == [], name


def test_pattern_legends_name_their_quantity():
    assert "|H(t) − H(0)|" in legend("max |dH|") and "|L(t) − L(0)|" in legend("max|dL|")
    assert "constraint" in legend("max |J|")
    assert legend("no such column") is None
    lines = format_legend([{"method": "a", "run [s]": 1.0}]).splitlines()
    assert len(lines) == 2 and lines[0].strip().startswith("method")


def test_cli_prints_the_legend_under_the_table(tmp_path, capsys, monkeypatch):
    """`geomjax reproduce` prints one legend line per column under the summary table (the
    experiment itself is replaced by its summary: running one is other tests' job)."""
    import geomjax.experiments
    from geomjax._cli import main

    rows = [{"method": "rk4", "max |dH|": 1e-9, "run [s]": 0.1, "default check": "ok"}]
    monkeypatch.setattr(geomjax.experiments, "reproduce", lambda name, out, **kw: {"summary": rows, "arrays": f"{name}.npz"})
    assert main(["reproduce", "damped-oscillator", "--out", str(tmp_path)]) == 0
    table, legend_block = capsys.readouterr().out.split("columns:\n", 1)
    assert all(line.strip() for line in legend_block.splitlines()[: len(rows[0])])
    for column in rows[0]:
        assert f"  {column}  " in legend_block and column in table


def test_reproduce_stores_the_legends(tmp_path):
    from geomjax.experiments import _columns

    assert _columns.legends([{"method": "a", "steps": 3}]) == {"method": _columns.LEGENDS["method"], "steps": _columns.LEGENDS["steps"]}
