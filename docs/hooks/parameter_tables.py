"""MkDocs hook: the argument lists of the API pages become tables.

Docstrings here list their parameters in the equinox style, a bold heading and a list:

    **Arguments:**

    - `x0`: initial flat state (float64).
    - `rtol`, `atol`: for diffrax solvers.

mkdocstrings renders that as a paragraph and a bullet list. This hook turns every such
list whose items all start with code-formatted names and a colon into a two-column table
(name, description), for the headings Arguments, Fields, Returns, Attributes and Raises.
A list with any item of another form is left as it is.
"""

import re

_HEADINGS = ("Arguments", "Fields", "Returns", "Attributes", "Raises", "Keyword arguments")
_BLOCK = re.compile(
    r"<p><strong>(" + "|".join(_HEADINGS) + r"):</strong></p>\s*<ul>(.*?)</ul>",
    re.S,
)
_ITEM = re.compile(r"<li>(.*?)</li>", re.S)
# one or more code spans separated by commas / "and", then a colon
_NAMES = re.compile(r"^\s*((?:<code>[^<]+</code>(?:\s*(?:,|and|or)\s*)?)+)\s*:\s*(.*)$", re.S)


def parameter_table(heading: str, items_html: str) -> str | None:
    """The table for one list, or None when an item does not start with `name`: text."""
    rows = []
    for item in _ITEM.findall(items_html):
        match = _NAMES.match(item)
        if match is None:
            return None
        names = ", ".join(re.findall(r"<code>[^<]+</code>", match.group(1)))
        rows.append(f"<tr><td>{names}</td><td>{match.group(2).strip()}</td></tr>")
    if not rows:
        return None
    first = "Field" if heading in ("Fields", "Attributes") else "Exception" if heading == "Raises" else "Name"
    return (
        f'<p><strong>{heading}:</strong></p>\n<table class="parameter-table">\n'
        f"<thead><tr><th>{first}</th><th>Description</th></tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"
    )


def on_page_content(html, page, config, files):
    """MkDocs event: rewrite the argument lists of a page."""

    def table(match):
        return parameter_table(match.group(1), match.group(2)) or match.group(0)

    return _BLOCK.sub(table, html)
