"""Poisson structures: antisymmetry and the Jacobi identity of geomjax.bracket.

Every shipped structure is checked with random cubic polynomials F, G, K at random points:
{F, G} = −{G, F} and {F, {G, K}} + {G, {K, F}} + {K, {F, G}} = 0. A tensor that is
antisymmetric but violates Jacobi is run through the same check to show that it detects
a failure.
"""

import inspect

import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from geomjax._system.structures import AbstractPoissonStructure


def _hat(v):
    return jnp.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def _constant_symplectic(d, seed=3):
    """A fixed non-degenerate antisymmetric matrix of even size d (any constant one is Poisson)."""
    a = np.random.default_rng(seed).normal(size=(d, d))
    b = a - a.T
    assert abs(np.linalg.det(b)) > 1e-3
    return jnp.asarray(b)


_B4 = _constant_symplectic(4)

# (id, structure); the dense so(3) is written as B(x)v = x × v, i.e. B(x) = hat(x).
STRUCTURES = [
    ("canonical1", geomjax.canonical(1)),
    ("canonical3", geomjax.canonical(3)),
    ("so3", geomjax.lie_poisson_so3()),
    ("se2", geomjax.lie_poisson_se2()),
    ("user_constant4", geomjax.PoissonStructure(lambda x: _B4)),
    ("user_so3_dense", geomjax.PoissonStructure(_hat, dim=3)),
    # Embedded left-trivialised bundles: Jacobi holds on and off the group.
    ("left_trivialised_so3", geomjax.left_trivialised_so3()),
    ("left_trivialised_se2", geomjax.left_trivialised_se2()),
    ("left_trivialised_se2_shape1", geomjax.left_trivialised_se2(1)),
]
_BY_NAME = dict(STRUCTURES)


def _dims():
    return {
        "canonical1": 2,
        "canonical3": 6,
        "so3": 3,
        "se2": 3,
        "user_constant4": 4,
        "user_so3_dense": 3,
        "left_trivialised_so3": 12,
        "left_trivialised_se2": 7,
        "left_trivialised_se2_shape1": 9,
    }


def poly(c, x):
    """A cubic polynomial a·x + ½xᵀSx + (1/6)Σ T_ijk x_i x_j x_k with coefficients c = (a, S, T)."""
    a, s, t = c
    return a @ x + 0.5 * x @ s @ x + jnp.einsum("ijk,i,j,k->", t, x, x, x) / 6.0


def _random_poly(rng, d):
    return (
        jnp.asarray(rng.normal(size=d)),
        jnp.asarray(rng.normal(size=(d, d))),
        jnp.asarray(rng.normal(size=(d, d, d))),
    )


_CHECKERS = {}


def bracket_checks(structure):
    """A jitted map (cF, cG, cK, x) ↦ ({F,G}, {G,F}, the three cyclic Jacobi terms), built once."""
    key = id(structure)
    if key not in _CHECKERS:

        def terms(cf, cg, ck, x):
            f = lambda y: poly(cf, y)  # noqa: E731
            g = lambda y: poly(cg, y)  # noqa: E731
            k = lambda y: poly(ck, y)  # noqa: E731
            br = lambda a, b: geomjax.bracket(a, b, structure)  # noqa: E731
            fg, gf = br(f, g)(x), br(g, f)(x)
            cyc = jnp.stack([br(f, br(g, k))(x), br(g, br(k, f))(x), br(k, br(f, g))(x)])
            return fg, gf, cyc

        _CHECKERS[key] = jax.jit(jax.vmap(terms, in_axes=(None, None, None, 0)))
    return _CHECKERS[key]


def _sample(structure, d, seed, points=6):
    rng = np.random.default_rng(seed)
    cf, cg, ck = (_random_poly(rng, d) for _ in range(3))
    xs = jnp.asarray(rng.uniform(-1.5, 1.5, size=(points, d)))
    return bracket_checks(structure)(cf, cg, ck, xs)


@pytest.mark.parametrize("name", [n for n, _ in STRUCTURES])
def test_bracket_antisymmetric_and_jacobi(name):
    structure = _BY_NAME[name]
    d = _dims()[name]
    for seed in range(3):
        fg, gf, cyc = _sample(structure, d, seed)
        fg, gf, cyc = map(np.asarray, (fg, gf, cyc))
        assert np.all(np.isfinite(cyc))
        # The test functions are generic: the bracket is not identically zero.
        assert np.max(np.abs(fg)) > 1e-3
        np.testing.assert_allclose(fg, -gf, rtol=1e-13, atol=1e-12)
        scale = np.abs(cyc).sum(axis=1)
        assert np.all(scale > 1e-6), "Jacobi terms vanish identically: the check would be vacuous"
        jacobiator = np.abs(cyc.sum(axis=1))
        assert np.all(jacobiator <= 1e-11 * scale + 1e-12), (name, jacobiator, scale)


def test_jacobi_check_detects_a_non_poisson_tensor():
    """B(x) = hat(v(x)) with v = (x₂, x₃, x₁): antisymmetric, but v·curl v ≠ 0 breaks Jacobi."""
    fake = geomjax.PoissonStructure(lambda x: _hat(jnp.stack([x[1], x[2], x[0]])), dim=3)
    fg, gf, cyc = map(np.asarray, _sample(fake, 3, seed=0))
    np.testing.assert_allclose(fg, -gf, rtol=1e-13, atol=1e-12)
    jacobiator = np.abs(cyc.sum(axis=1))
    scale = np.abs(cyc).sum(axis=1)
    assert np.max(jacobiator / scale) > 1e-3


def test_every_shipped_structure_is_checked():
    """Each concrete Poisson structure class in geomjax must appear in STRUCTURES above."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    shipped = {
        cls
        for cls in subclasses(AbstractPoissonStructure)
        if cls.__module__.startswith("geomjax") and not inspect.isabstract(cls)
    }
    tested = {type(s) for _, s in STRUCTURES}
    missing = sorted(c.__qualname__ for c in shipped - tested)
    assert not missing, f"add these Poisson structures to tests/test_structures.py::STRUCTURES: {missing}"


@pytest.mark.parametrize("name", [n for n, _ in STRUCTURES])
def test_matrix_is_antisymmetric_and_matches_bracket(name, rng):
    """structure.matrix(x) is antisymmetric and {F, G} = ∇F·B∇G; X_F = B∇F."""
    structure = _BY_NAME[name]
    d = _dims()[name]
    x = jnp.asarray(rng.uniform(-1.0, 1.0, size=d))
    cf, cg = _random_poly(rng, d), _random_poly(rng, d)
    f = lambda y: poly(cf, y)  # noqa: E731
    g = lambda y: poly(cg, y)  # noqa: E731
    b = np.asarray(structure.matrix(x))
    assert b.shape == (d, d)
    np.testing.assert_allclose(b, -b.T, atol=1e-15)
    gf, gg = np.asarray(jax.grad(f)(x)), np.asarray(jax.grad(g)(x))
    np.testing.assert_allclose(float(geomjax.bracket(f, g, structure)(x)), gf @ b @ gg, rtol=1e-12)
    xf = np.asarray(geomjax.hamiltonian_vector_field(f, structure)(x))
    np.testing.assert_allclose(xf, b @ gf, rtol=1e-12, atol=1e-12)


def _coord(i):
    return lambda x: x[i]


def test_canonical_coordinate_brackets():
    """{q_i, p_j} = δ_ij, {q_i, q_j} = {p_i, p_j} = 0 and X_H = (∂H/∂p, −∂H/∂q)."""
    n = 3
    s = geomjax.canonical(n)
    x = jnp.arange(1.0, 2 * n + 1.0) / 7.0
    table = np.array([[float(geomjax.bracket(_coord(i), _coord(j), s)(x)) for j in range(2 * n)] for i in range(2 * n)])
    expected = np.block([[np.zeros((n, n)), np.eye(n)], [-np.eye(n), np.zeros((n, n))]])
    np.testing.assert_array_equal(table, expected)

    def h(y):
        q, p = y[:n], y[n:]
        return 0.5 * p @ p + jnp.sum(jnp.cos(q)) + q[0] * p[1]

    xh = np.asarray(geomjax.hamiltonian_vector_field(h, s)(x))
    q, p = np.asarray(x[:n]), np.asarray(x[n:])
    dh_dp = p + np.array([0.0, q[0], 0.0])
    dh_dq = -np.sin(q) + np.array([p[1], 0.0, 0.0])
    np.testing.assert_allclose(xh, np.concatenate([dh_dp, -dh_dq]), rtol=1e-14)


def test_lie_poisson_coordinate_brackets():
    """so(3)*: {Π₁, Π₂} = −Π₃ (cyclic); se(2)*: {μ_θ, μ_x} = −μ_y, {μ_θ, μ_y} = μ_x, {μ_x, μ_y} = 0."""
    x = jnp.array([0.3, -1.1, 2.5])
    so3 = geomjax.lie_poisson_so3()
    for i, j, k in [(0, 1, 2), (1, 2, 0), (2, 0, 1)]:
        assert float(geomjax.bracket(_coord(i), _coord(j), so3)(x)) == pytest.approx(-float(x[k]))
    # Euler's equations Π̇ = Π × I⁻¹Π for the free rigid body.
    inertia = jnp.array([3.0, 2.0, 1.0])
    xh = geomjax.hamiltonian_vector_field(lambda m: 0.5 * jnp.sum(m**2 / inertia), so3)(x)
    np.testing.assert_allclose(xh, np.cross(x, x / inertia), rtol=1e-14)

    se2 = geomjax.lie_poisson_se2()
    br = lambda i, j: float(geomjax.bracket(_coord(i), _coord(j), se2)(x))  # noqa: E731
    assert br(0, 1) == pytest.approx(-float(x[2]))
    assert br(0, 2) == pytest.approx(float(x[1]))
    assert br(1, 2) == 0.0


def test_structures_reject_bad_sizes():
    with pytest.raises(ValueError, match="positive integer"):
        geomjax.canonical(0)
    with pytest.raises(ValueError, match="positive integer"):
        geomjax.canonical(1.5)
