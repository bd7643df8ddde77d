"""What users read names the papers by their authors and year: no "seed 00x" (the working
names of the papers in this project) and no issue numbers, in the library's text (messages,
docstrings, experiment descriptions, figure titles and JSON strings all come from these
files), in `geomjax list`, in the README and in the documentation."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKING_NAMES = re.compile(r"\b[Ss]eeds? 00\d|\band 00\d\b|\b[Ii]ssues? \d+|\b[Tt]he issue\b|\bseed (?:eqs?|Figs?)\.")


def _offending(paths):
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if WORKING_NAMES.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    return found


def test_library_text_names_papers_by_authors():
    assert _offending(sorted((ROOT / "geomjax").rglob("*.py"))) == []


def test_docs_and_readme_name_papers_by_authors():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert _offending(pages) == []


def test_notebooks_name_papers_by_authors():
    """The notebooks (rendered on the site as they are) too."""
    assert _offending(sorted((ROOT / "notebooks").glob("*.ipynb"))) == []


def test_the_pattern_finds_working_names():
    """The check can fail: each working name it is meant to catch is caught."""
    for text in ("seed 001", "seeds 003, 004", "Salnikov and Hamdouni (2019) and 004.", "issue 25",
                 "The issue's target", "seed eq. (7)"):
        assert WORKING_NAMES.search(text), text


def test_geomjax_list_names_papers_by_authors():
    out = subprocess.run([sys.executable, "-m", "geomjax", "list"], capture_output=True, text=True, check=True).stdout
    assert "Chang" in out and not WORKING_NAMES.search(out)
