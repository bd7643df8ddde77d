"""MkDocs hook: pages take sections of README.md and the experiment figures by reference.

Two markers, each alone on a line of a page's Markdown:

- `<!-- readme: TITLE -->` is replaced by the body of the README section whose heading is
  `TITLE` (any level; the body runs to the next heading of the same or a higher level,
  headings inside fenced code do not count; sub-headings are kept, shifted to sit below
  the page's own). The README stays the one source of those tables (the bad-input table is
  checked row by row by tests/test_bad_input_table.py).
- `<!-- experiments -->` is replaced by one section per experiment listed in
  `docs/figures/experiments.json` (written by docs/generate_figures.py from `geomjax list`):
  its description, what it reproduces (its row of the README's Experiments table), its
  summary table and its figures from `docs/figures/NAME/`.

A marker naming a README section that does not exist is an error, so a renamed heading
breaks the (strict) build instead of leaving a hole in the site.

It also shows a pipe escaped inside a code span of a table cell (`a \\| b`) as GitHub
does, without the backslash.
"""

import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIGURES = ROOT / "docs" / "figures"

_README_MARKER = re.compile(r"^<!-- readme: (.+?) -->$", re.M)
_EXPERIMENTS_MARKER = "<!-- experiments -->"
_HEADING = re.compile(r"^(#{1,6}) (.+)$")


def _sections(text: str) -> dict[str, tuple[int, list[str]]]:
    """README heading title -> (level, body lines), ignoring `#` lines in code fences."""
    lines = text.splitlines()
    headings = []  # (line index, level, title)
    fence = None
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
            continue
        match = _HEADING.match(line) if fence is None else None
        if match:
            headings.append((i, len(match.group(1)), match.group(2).strip()))
    out = {}
    for k, (start, level, title) in enumerate(headings):
        end = next((i for i, lev, _ in headings[k + 1 :] if lev <= level), len(lines))
        out[title] = (level, lines[start + 1 : end])
    return out


def readme_section(title: str, page_level: int = 1) -> str:
    """The body of README section `title`, its sub-headings placed below `page_level`."""
    sections = _sections(README.read_text(encoding="utf-8"))
    if title not in sections:
        raise KeyError(f"README.md has no section {title!r}; its sections are {sorted(sections)}")
    level, body = sections[title]
    shift = page_level + 1 - (level + 1)
    fixed, fence = [], None
    for line in body:
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
        match = _HEADING.match(line) if fence is None else None
        if match:
            line = "#" * min(6, max(1, len(match.group(1)) + shift)) + " " + match.group(2)
        fixed.append(line)
    return "\n".join(fixed).strip("\n")


def _split_row(row: str) -> list[str]:
    cells = row.strip().strip("|").replace("\\|", "\0").split("|")
    return [c.strip().replace("\0", "\\|") for c in cells]


def readme_experiment_rows() -> dict[str, str]:
    """Experiment name -> its 'what it reproduces' cell in the README's Experiments table."""
    rows = {}
    for line in readme_section("Experiments").splitlines():
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


def experiments_markdown() -> str:
    """One section per experiment: description, README row, summary table, figures."""
    listed = json.loads((FIGURES / "experiments.json").read_text(encoding="utf-8"))
    reproduces = readme_experiment_rows()
    parts = []
    for name, description in listed.items():
        parts += [f"## `{name}`", "", description, ""]
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
    """MkDocs event: expand the markers of one page."""
    if _EXPERIMENTS_MARKER in markdown:
        markdown = markdown.replace(_EXPERIMENTS_MARKER, experiments_markdown())

    def expand(match):
        # the README section sits below the last heading above the marker
        above = markdown[: match.start()]
        levels = [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", above, re.M)]
        return readme_section(match.group(1).strip(), levels[-1] if levels else 1)

    return _README_MARKER.sub(expand, markdown)


_CODE = re.compile(r"<code>(.*?)</code>", re.S)


def on_page_content(html, page, config, files):
    """MkDocs event: a pipe escaped in a table cell's code span (`a \\| b`, as GitHub reads
    it) is kept escaped by Python-Markdown's tables; show it as GitHub does."""
    return _CODE.sub(lambda m: "<code>" + m.group(1).replace("\\|", "|") + "</code>", html)
