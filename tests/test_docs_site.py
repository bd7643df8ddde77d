"""The documentation site builds with `mkdocs build --strict` and documents the public API.

One build (a subprocess, into a temporary directory) is shared by the tests of this
module; mkdocs, mkdocs-material and mkdocstrings[python] are in the `test` extra. Strict mode turns every warning into an error: a broken link or anchor, a name
mkdocstrings cannot resolve, a snippet or notebook a page includes that no longer exists.
"""

import html
import importlib.util
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

import geomjax

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "experiments.py"

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _page(site, name):
    return (site / name / "index.html").read_text(encoding="utf-8")


def _object_html(page, anchor):
    """The HTML of the documented object whose heading has id `anchor`."""
    start = page.index(f'id="{anchor}"')
    own = page.index('class="doc doc-heading"', start)
    end = page.find('class="doc doc-heading"', own + 1)
    return page[start : end if end != -1 else len(page)]


def _load_hook():
    spec = importlib.util.spec_from_file_location("experiments_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_integrate_page_has_its_docstring(site):
    page = _page(site, "api/driver")
    first_line = inspect.getdoc(geomjax.integrate).splitlines()[0]
    body = _object_html(page, "geomjax.integrate")
    # backticks in the docstring render as <code>; compare the text without tags
    text = html.unescape(re.sub(r"<[^>]+>", "", body))
    assert first_line.replace("`", "") in text
    # the example renders as a highlighted code block with its doctest prompts
    assert "&gt;&gt;&gt;" in body and 'class="highlight"' in body


def _public(module):
    for name in sorted(vars(module)):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if not isinstance(obj, types.ModuleType):
            yield name, obj
    if module is geomjax:  # imported lazily by geomjax.__getattr__
        yield "StepSolver", geomjax.StepSolver


@pytest.mark.parametrize("module", [geomjax, geomjax.models, geomjax.diagnostics], ids=lambda m: m.__name__)
def test_every_public_name_has_an_api_entry(site, module):
    anchors = set()
    for path in (site / "api").rglob("index.html"):
        anchors.update(re.findall(r'id="([^"]+)"', path.read_text(encoding="utf-8")))
    missing = []
    for name, obj in _public(module):
        candidates = {f"{module.__name__}.{name}"}
        if getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
            candidates.add(f"{obj.__module__}.{obj.__qualname__}")
        if not candidates & anchors:
            missing.append(name)
    assert not missing, f"public names of {module.__name__} without an API entry: {missing}"


def _table_rows(markdown):
    return [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]


def test_tables_render_every_row(site):
    """The bad-input, performance and experiments pages show every row of their tables."""
    for source, page in [("guide/bad_input.md", "guide/bad_input"), ("performance.md", "performance"), ("experiments.md", "experiments")]:
        rows = _table_rows((ROOT / "docs" / source).read_text(encoding="utf-8"))
        assert len(rows) > 5, source
        built = _page(site, page)
        assert built.count("<tr>") >= len(rows), (source, built.count("<tr>"), len(rows))
        # pipes escaped in table code spans (`max\\|x0\\|`) show as on GitHub
        assert not any("\\|" in code for code in re.findall(r"<code>(.*?)</code>", built, re.S))
    assert "<code>start_tol·(1 + max|x0|)</code>" in _page(site, "guide/status")


def test_notebooks_are_rendered_as_examples(site):
    """Every notebook in notebooks/ is a page of the Examples section, with its outputs."""
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 8
    for name in notebooks:
        page = _page(site, f"examples/{name}")
        assert "jp-OutputArea" in page or "output_png" in page or "<img" in page, name


def test_changelog_and_citation():
    assert "--8<-- \"CHANGELOG.md\"" in (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert "cff-version:" in cff and "Feedback integrators for mechanical systems with holonomic constraints" in cff


def test_experiments_page_lists_every_experiment_with_its_figures(site):
    listed = json.loads((ROOT / "docs" / "figures" / "experiments.json").read_text(encoding="utf-8"))
    page = _page(site, "experiments")
    for name in listed:
        assert f'id="{name}"' in page, name
    for src in re.findall(r'<img[^>]+src="([^"]+)"', page):
        assert (site / "experiments" / src).resolve().is_file(), src


def test_api_arguments_are_tables(site):
    """The API pages show `**Arguments:**` lists as name/description tables."""
    body = _object_html(_page(site, "api/driver"), "geomjax.integrate")
    assert 'class="parameter-table"' in body and "<td><code>x0</code></td>" in body
    spec = importlib.util.spec_from_file_location("parameter_tables", ROOT / "docs" / "hooks" / "parameter_tables.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.parameter_table("Arguments", "<li><code>a</code>, <code>b</code>: two</li>").count("<tr>") == 2
    assert hook.parameter_table("Arguments", "<li>free text, no name</li>") is None  # left as a list


def test_internal_members_are_not_documented(site):
    assert "from_chunks" not in _page(site, "api/driver")


def test_experiment_rows_come_from_the_page():
    hook = _load_hook()
    rows = hook.experiment_rows("| name | what |\n|---|---|\n| `a`, `b` | text with `code \\| pipe` |\n")
    assert rows == {"a": "text with `code \\| pipe`", "b": "text with `code \\| pipe`"}


_FENCE = re.compile(r"```python\n(.*?)```", re.S)
_DOC_PAGES = {
    path.relative_to(ROOT).as_posix(): _FENCE.findall(path.read_text(encoding="utf-8"))
    for path in sorted((ROOT / "docs").rglob("*.md"))
}
_DOC_PAGES = {page: blocks for page, blocks in _DOC_PAGES.items() if blocks}


@pytest.mark.parametrize("page", list(_DOC_PAGES))
@pytest.mark.filterwarnings("ignore::geomjax.ChosenGainsWarning")  # what the getting-started page shows
def test_docs_python_blocks_run(page):
    """The ```python blocks of each page under docs/ run, in order, in one namespace (a
    page's later blocks go on from its earlier ones, as a reader does; README blocks:
    test_readme.py)."""
    namespace = {"__name__": "__docs__"}
    for index, code in enumerate(_DOC_PAGES[page]):
        exec(compile(code, f"<{page} python block {index}>", "exec"), namespace)


def test_generate_figures_shrinks_pngs(tmp_path):
    """docs/generate_figures.py scales wide figures down and palette-encodes them."""
    PIL = pytest.importorskip("PIL.Image")
    spec = importlib.util.spec_from_file_location("generate_figures", ROOT / "docs" / "generate_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    image = PIL.new("RGB", (1800, 600), "white")
    for x in range(0, 1800, 7):  # line art: a few colours
        image.putpixel((x, x % 600), (31, 119, 180))
    source, target = tmp_path / "wide.png", tmp_path / "small.png"
    image.save(source)
    module.shrink_png(source, target, max_width=900)
    with PIL.open(target) as small:
        assert small.size == (900, 300) and small.mode == "P"
    module.shrink_png(target, tmp_path / "same.png", max_width=900)  # narrow enough: not resized
    with PIL.open(tmp_path / "same.png") as same:
        assert same.size == (900, 300)
