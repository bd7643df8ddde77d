"""Packaging: the type-annotation marker ships, the plotting and progress-bar libraries stay
out of `import geomjax`, and the lower bounds of the dependencies are the versions CI tests.

Cheap: reads files and runs one `import geomjax` in a fresh process (no compilation).
"""

import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_py_typed_marker_is_package_data():
    # PEP 561: type checkers read a package's inline annotations only if it has py.typed.
    assert (ROOT / "geomjax" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["geomjax"]


def test_import_leaves_optional_libraries_unloaded():
    # matplotlib (plots) and tqdm (progress bars) are imported on first use only, so
    # `import geomjax` costs neither.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import geomjax; "
        "print(geomjax.__file__); print(sorted(m for m in ('matplotlib', 'tqdm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    path, loaded = out.stdout.split("\n")[:2]
    assert pathlib.Path(path).resolve().parent == ROOT / "geomjax"
    assert loaded == "[]"


def _lower_bounds():
    bounds = {}
    for req in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)", req.replace(" ", ""))
        assert m, f"dependency {req!r} is not of the form name>=version"
        bounds[m[1].lower()] = m[2]
    return bounds


def test_min_versions_file_pins_the_lower_bounds():
    # CI's `min-versions` job installs .ci/min-versions.txt: each pin there must be the
    # lower bound pyproject.toml declares, so the declared minimum is the tested one.
    pins = {}
    for line in (ROOT / ".ci" / "min-versions.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    bounds = _lower_bounds()
    for name in ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax", "optax", "jaxtyping", "numpy"):
        assert pins.get(name) == bounds.get(name), (name, pins.get(name), bounds.get(name))


def test_the_license_is_in_the_repository_and_declared_for_the_wheel():
    """LICENSE exists, is the Apache-2.0 text, and pyproject ships it (PEP 639 fields; the
    wheel's contents are checked by CI's wheel job, .ci/wheel_check.py)."""
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
