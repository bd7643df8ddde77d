"""Shared set-up for the geomjax test suite.

geomjax enables float64 on import, so it is imported here before any test module builds
arrays. Hypothesis runs few examples with no deadline: the first example of a test pays
for JAX compilation, and the jitted functions the tests call are built once per module.
"""

import os

import _xla_flags  # noqa: F401  (sets XLA_FLAGS for the tests: before JAX starts its backend)
import geomjax  # noqa: F401  (enables jax_enable_x64 before anything else creates arrays)
import jax

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Many tests build the same programs anew (a model's field, a run with the same settings):
# JAX's persistent compilation cache lets a program XLA compiled once be loaded instead of
# compiled again (about 10% of the suite's time). One fresh directory per run, made by the
# first process (pytest, or xdist's controller) and inherited by the xdist workers through
# the environment; removed at the end by the process that made it. GEOMJAX_TEST_CACHE=0
# turns it off.
_CACHE_OWNER = False
if os.environ.get("GEOMJAX_TEST_CACHE", "1") != "0":
    if "GEOMJAX_TEST_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["GEOMJAX_TEST_CACHE_DIR"] = tempfile.mkdtemp(prefix="geomjax-test-xla-cache-")
        _CACHE_OWNER = True
    jax.config.update("jax_compilation_cache_dir", os.environ["GEOMJAX_TEST_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if _CACHE_OWNER:
        import shutil

        shutil.rmtree(os.environ.pop("GEOMJAX_TEST_CACHE_DIR"), ignore_errors=True)


settings.register_profile(
    "geomjax",
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("GEOMJAX_HYPOTHESIS_PROFILE", "geomjax"))


@pytest.fixture
def rng():
    """A fresh, seeded NumPy generator per test (tests are reproducible and independent)."""
    return np.random.default_rng(20240611)


@pytest.fixture(scope="session")
def spherical():
    """Seed 000 §2.3: the spherical pendulum with m = g = ℓ = 1."""
    return geomjax.models.spherical_pendulum()


@pytest.fixture(scope="session")
def planar():
    """Seed 000 §2.4: the planar pendulum with m = g = ℓ = 1."""
    return geomjax.models.planar_pendulum()


def spherical_quantities(x, m=1.0, g=1.0):
    """(f1, f2, H, J) of the spherical pendulum, written out by hand (works on a batch)."""
    x = jnp.asarray(x)
    q, p = x[..., :3], x[..., 3:]
    f1 = jnp.sum(q * q, axis=-1)
    f2 = jnp.sum(q * p, axis=-1)
    h = jnp.sum(p * p, axis=-1) / (2 * m) + m * g * q[..., 2]
    j = q[..., 0] * p[..., 1] - q[..., 1] * p[..., 0]
    return jnp.stack([f1, f2, h, j], axis=-1)


def _resident_bytes():
    """This process's resident memory in bytes (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# A module's tests keep the programs they compile (later tests of the module share what
# they trace: tests/test_closures.py in one process 65 s of user time instead of 74 s when
# its cases' programs are kept) while the process holds less than this; past it, they are
# dropped after each test, so that a worker stays under 2 GB (a worker measured 2.15 GB at
# peak over the suite with programs dropped only at the end of each module).
_KEEP_PROGRAMS_BELOW = 1.2e9


@pytest.fixture(autouse=True)
def _release_programs_past_a_size():
    """Drop the compiled programs after a test once the process holds more than
    `_KEEP_PROGRAMS_BELOW` (after every test where its size is not known)."""
    yield
    resident = _resident_bytes()
    if resident is None or resident > _KEEP_PROGRAMS_BELOW:
        jax.clear_caches()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Each test module's compiled programs are dropped when it ends (JAX's in-memory caches
    and the simplification pass's plans): an xdist worker otherwise holds every program of
    every module it ran (measured 2.7–5.2 GB per worker over the suite; keeping them while
    a worker stays under 1.2 GB measured 2.2 GB at peak and no faster). Programs a later
    module needs again load from the persistent compilation cache above."""
    yield
    jax.clear_caches()
    from geomjax.internal import simplify

    simplify.clear_cache()
