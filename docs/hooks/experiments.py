"""MkDocs hook: the experiments page shows every experiment with its figures.

`<!-- experiments -->`, alone on a line of a page, is replaced by one section per
experiment listed in `docs/figures/experiments.json` (written by docs/generate_figures.py
from `geomjax list`): its description, what it reproduces (its row of the table "| name |
what it reproduces | ..." on the same page), its summary table and its figures from
`docs/figures/NAME/`.

It also shows a pipe escaped inside a code span of a table cell (`a \\| b`) as GitHub
does, without the backslash.
"""

import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"

_EXPERIMENTS_MARKER = "<!-- experiments -->"
_HEADING = re.compile(r"^(#{1,6}) (.+)$")


def _split_row(row: str) -> list[str]:
    cells = row.strip().strip("|").replace("\\|", "\0").split("|")
    return [c.strip().replace("\0", "\\|") for c in cells]


def experiment_rows(markdown: str) -> dict[str, str]:
    """Experiment name -> its 'what it reproduces' cell in the page's table of experiments
    (rows `| `name`, ... | text | ...`)."""
    rows = {}
    for line in markdown.splitlines():
        if not line.startswith("| `"):
            continue
        names, text = _split_row(line)[:2]
        for name in re.findall(r"`([^`]+)`", names):
            rows[name] = text
    return rows


def _summary_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])

    def cell(value):
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value).replace("|", "\\|") if value is not None else ""

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def experiments_markdown(page_markdown: str = "") -> str:
    """One section per experiment: description, its row of the page's table, summary
    table, figures."""
    listed = json.loads((FIGURES / "experiments.json").read_text(encoding="utf-8"))
    reproduces = experiment_rows(page_markdown)
    parts = []
    for name, description in listed.items():
        parts += [f"### `{name}`", "", description, ""]
        if name in reproduces:
            parts += [f"**What it reproduces.** {reproduces[name]}", ""]
        folder = FIGURES / name
        summary_file = folder / "summary.json"
        if summary_file.exists():
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
            table = _summary_table(summary.get("summary", []))
            if table:
                parts += ["??? note \"Summary table\"", ""]
                parts += ["    " + line for line in table.splitlines()]
                parts += [""]
            parts += [f"`geomjax reproduce {name}` ran in {summary.get('seconds', '?')} s when these figures were made.", ""]
        pngs = sorted(folder.glob("*.png")) if folder.is_dir() else []
        if pngs:
            for png in pngs:
                parts += [f"![{name}: {png.stem}](figures/{name}/{png.name}){{ loading=lazy }}", ""]
        else:
            parts += [f"No figures in the documentation yet: `python docs/generate_figures.py {name}` makes them.", ""]
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    """MkDocs event: expand the experiments marker of a page."""
    if _EXPERIMENTS_MARKER in markdown:
        markdown = markdown.replace(_EXPERIMENTS_MARKER, experiments_markdown(markdown))
    return markdown


_CODE = re.compile(r"<code>(.*?)</code>", re.S)


def on_page_content(html, page, config, files):
    """MkDocs event: a pipe escaped in a table cell's code span (`a \\| b`, as GitHub reads
    it) is kept escaped by Python-Markdown's tables; show it as GitHub does."""
    return _CODE.sub(lambda m: "<code>" + m.group(1).replace("\\|", "|") + "</code>", html)
