"""Plain-JAX structured solves (`geomjax._solve.linalg.tridiagonal_solve`, Thomas
elimination) against dense `jnp.linalg.solve`: values, flagged pivots, derivatives, vmap.

k ∈ {1, 2, 3, 4} take the unrolled path, k ∈ {8, 9, 33} the looped one.
"""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from geomjax._solve import linalg
from geomjax._solve.linalg import tridiagonal_solve, tridiagonal_solve_pair

SIZES = [1, 2, 3, 4, 8, 9, 33]


def _dense(dl, d, du):
    k = d.shape[0]
    return jnp.diag(d) + jnp.diag(dl[1:], -1) + jnp.diag(du[: k - 1], 1)


def _dominant(rng, k):
    """A random tridiagonal matrix, diagonally dominant by rows, of either sign."""
    dl, du = rng.normal(size=k), rng.normal(size=k)
    dl[0], du[-1] = 0.0, 0.0
    d = (np.abs(dl) + np.abs(du) + rng.uniform(0.5, 1.5, k)) * rng.choice([-1.0, 1.0], k)
    return dl, d, du


def _spd(rng, k):
    """T = B Bᵀ for a lower bidiagonal B: symmetric positive definite, not dominant."""
    a, c = rng.uniform(0.5, 1.5, k), rng.uniform(-1.5, 1.5, k)
    b = np.diag(a) + np.diag(c[1:], -1)
    t = b @ b.T
    return np.concatenate([[0.0], np.diag(t, -1)]), np.diag(t).copy(), np.concatenate([np.diag(t, 1), [0.0]])


@pytest.mark.parametrize("kind", [_dominant, _spd])
@pytest.mark.parametrize("k", SIZES)
def test_thomas_agrees_with_the_dense_solve(k, kind, rng):
    dl, d, du = kind(rng, k)
    t = _dense(*map(jnp.asarray, (dl, d, du)))
    b = jnp.asarray(rng.normal(size=k))
    x = tridiagonal_solve(*map(jnp.asarray, (dl, d, du)), b)
    ref = jnp.linalg.solve(t, b)
    scale = float(jnp.max(jnp.abs(ref))) * float(np.linalg.cond(np.asarray(t)))
    assert float(jnp.max(jnp.abs(x - ref))) <= 1e-14 * scale
    # several right-hand sides at once, and the residual
    bs = jnp.asarray(rng.normal(size=(k, 3)))
    xs = tridiagonal_solve(*map(jnp.asarray, (dl, d, du)), bs)
    assert float(jnp.max(jnp.abs(t @ xs - bs))) <= 1e-13 * float(jnp.max(jnp.abs(t))) * float(jnp.max(jnp.abs(xs)))


def _zero_pivot(k):
    """An invertible T whose second Thomas pivot vanishes: u₁ = d₁ − dl₁du₀/d₀ = 1 − 1 = 0."""
    d, off = np.full(k, 3.0), np.ones(k)
    d[:2] = 1.0
    dl, du = off.copy(), off.copy()
    dl[0], du[-1] = 0.0, 0.0
    return dl, d, du


@pytest.mark.parametrize("k", [3, 9])
@pytest.mark.parametrize("eps", [0.0, 1e-12])
def test_vanishing_or_tiny_pivot_gives_non_finite_not_a_wrong_answer(k, eps):
    dl, d, du = _zero_pivot(k)
    d[1] += eps  # u₁ = eps: T stays well conditioned, the elimination without pivoting does not
    t = np.asarray(_dense(*map(jnp.asarray, (dl, d, du))))
    assert np.linalg.cond(t) < 1e3
    b = jnp.arange(1.0, k + 1)
    x = jax.jit(tridiagonal_solve)(*map(jnp.asarray, (dl, d, du)), b)
    assert not bool(jnp.all(jnp.isfinite(x)))


def test_singular_matrix_gives_non_finite():
    dl, d, du = (jnp.array([0.0, 1.0, 1.0]), jnp.array([1.0, 2.0, 1.0]), jnp.array([1.0, 1.0, 0.0]))
    assert abs(np.linalg.det(np.asarray(_dense(dl, d, du)))) < 1e-14  # rows 0 + 2 = row 1
    assert not bool(jnp.all(jnp.isfinite(tridiagonal_solve(dl, d, du, jnp.array([1.0, 0.0, 0.0])))))


@pytest.mark.parametrize("k", [3, 9])
def test_derivatives_and_vmap_agree_with_the_dense_solve(k, rng):
    args = tuple(map(jnp.asarray, _dominant(rng, k) + (rng.normal(size=k),)))
    dense = lambda dl, d, du, b: jnp.linalg.solve(_dense(dl, d, du), b)
    tangents = tuple(jnp.asarray(rng.normal(size=k)) for _ in range(4))
    np.testing.assert_allclose(
        jax.jvp(tridiagonal_solve, args, tangents)[1], jax.jvp(dense, args, tangents)[1], rtol=1e-12, atol=1e-12
    )
    cot = jnp.asarray(rng.normal(size=k))
    for a, b in zip(jax.vjp(tridiagonal_solve, *args)[1](cot), jax.vjp(dense, *args)[1](cot)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # linear in b with coefficients independent of b: the transpose exists and is T⁻ᵀ
    (transposed,) = jax.linear_transpose(lambda b: tridiagonal_solve(*args[:3], b), args[3])(cot)
    np.testing.assert_allclose(transposed, jnp.linalg.solve(_dense(*args[:3]).T, cot), rtol=1e-12, atol=1e-12)
    # vmap over the diagonal and the right side
    ds = args[1] + 0.1 * jnp.asarray(rng.normal(size=(4, k)))
    bs = jnp.asarray(rng.normal(size=(4, k)))
    batched = jax.jit(jax.vmap(tridiagonal_solve, in_axes=(None, 0, None, 0)))(args[0], ds, args[2], bs)
    expected = jax.vmap(dense, in_axes=(None, 0, None, 0))(args[0], ds, args[2], bs)
    np.testing.assert_allclose(batched, expected, rtol=1e-12, atol=1e-12)


def _pair_dense(dl, d, du, b, c):
    """x = T⁻¹b and w = T⁻ᵀ(c + x·x₀) densely (a second right side that depends on x)."""
    t = _dense(dl, d, du)
    x = jnp.linalg.solve(t, b)
    return x, jnp.linalg.solve(t.T, c + x * x[0])


def _pair(dl, d, du, b, c):
    return tridiagonal_solve_pair(dl, d, du, b, lambda x: c + x * x[0])


@pytest.mark.parametrize("kind", [_dominant, _spd])
@pytest.mark.parametrize("k", SIZES)
def test_pair_agrees_with_two_dense_solves(k, kind, rng):
    args = tuple(map(jnp.asarray, kind(rng, k) + (rng.normal(size=k), rng.normal(size=k))))
    cond = float(np.linalg.cond(np.asarray(_dense(*args[:3]))))
    for got, ref in zip(jax.jit(_pair)(*args), _pair_dense(*args)):
        assert float(jnp.max(jnp.abs(got - ref))) <= 1e-13 * cond * float(jnp.max(jnp.abs(ref)))


@pytest.mark.parametrize("k", [3, 9])
@pytest.mark.parametrize("eps", [0.0, 1e-12])
def test_pair_flags_a_failing_pivot_in_both_solves(k, eps):
    dl, d, du = _zero_pivot(k)
    d[1] += eps
    b = jnp.arange(1.0, k + 1)
    x, w = jax.jit(_pair)(*map(jnp.asarray, (dl, d, du)), b, b)
    assert not bool(jnp.all(jnp.isfinite(x))) and not bool(jnp.all(jnp.isfinite(w)))


@pytest.mark.parametrize("k", [3, 9])
def test_pair_derivatives_and_vmap_agree_with_the_dense_solves(k, rng):
    args = tuple(map(jnp.asarray, _dominant(rng, k) + (rng.normal(size=k), rng.normal(size=k))))
    tangents = tuple(jnp.asarray(rng.normal(size=k)) for _ in range(5))
    for a, b in zip(jax.jvp(_pair, args, tangents)[1], jax.jvp(_pair_dense, args, tangents)[1]):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)
    cots = (jnp.asarray(rng.normal(size=k)), jnp.asarray(rng.normal(size=k)))
    for a, b in zip(jax.vjp(_pair, *args)[1](cots), jax.vjp(_pair_dense, *args)[1](cots)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)
    # jacfwd: jvps under vmap (the primal must not come out batched over the tangents)
    for a, b in zip(jax.jacfwd(_pair, argnums=1)(*args), jax.jacfwd(_pair_dense, argnums=1)(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)
    ds = args[1] + 0.1 * jnp.asarray(rng.normal(size=(4, k)))
    axes = (None, 0, None, None, None)
    for a, b in zip(jax.jit(jax.vmap(_pair, in_axes=axes))(args[0], ds, *args[2:]), jax.vmap(_pair_dense, in_axes=axes)(args[0], ds, *args[2:])):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)


def test_tridiagonal_solve_has_no_lapack_call():
    dl, d, du = _dominant(np.random.default_rng(0), 9)
    for k in (4, 9):
        jaxpr = str(jax.make_jaxpr(tridiagonal_solve)(*(jnp.asarray(v[:k]) for v in (dl, d, du)), jnp.ones(k)))
        assert "tridiagonal_solve" not in jaxpr and "custom_call" not in jaxpr


def test_linalg_doctests():
    result = doctest.testmod(linalg, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
