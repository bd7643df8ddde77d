"""Run by CI's `wheel` job in a fresh venv with the built wheel installed (no checkout on
the path): the installed package imports, has its version and data files, and runs the
README's example, and carries the LICENSE."""

import importlib.metadata
import pathlib

import jax
import jax.numpy as jnp

import geomjax

location = pathlib.Path(geomjax.__file__).resolve()
assert "site-packages" in location.parts, f"geomjax imported from {location}, not from the installed wheel"
assert importlib.metadata.version("geomjax") == geomjax.__version__
assert (location.parent / "py.typed").is_file()
# the license travels with the wheel (PEP 639: dist-info/licenses/LICENSE) and is named in its metadata
files = [str(f) for f in importlib.metadata.files("geomjax")]
assert any(f.endswith("licenses/LICENSE") for f in files), [f for f in files if "dist-info" in f]
assert importlib.metadata.metadata("geomjax")["License-Expression"] == "Apache-2.0"


def hamiltonian(x):
    q, p = x[:3], x[3:]
    return 0.5 * p @ p + 9.81 * q[2]


system = geomjax.System(hamiltonian, geomjax.canonical(3), holonomic=lambda q: q @ q - 1.0)
x0 = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
sol = geomjax.integrate(geomjax.rattle(system), x0, dt=0.01, steps=1000, save_every=10)
sphere = jax.vmap(lambda x: x[:3] @ x[:3] - 1.0)(sol.xs)
assert sol.message == "success" and float(jnp.abs(sphere).max()) < 1e-12
print(f"geomjax {geomjax.__version__} from the wheel: {sol.message}, max |g| = {float(jnp.abs(sphere).max()):.1e}")
