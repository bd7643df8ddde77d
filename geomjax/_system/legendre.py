"""The Legendre transform by autodiff: p = ∂L/∂v solved for v, and back.

One routine inverts the gradient map v ↦ ∂f/∂v(a, v) of a function f(a, v) that is
convex-like in v (a regular Lagrangian in the velocity, a regular Hamiltonian in the
momentum); `a` stands for everything else (q, or (q, z)). Both directions of the
Legendre transform are this routine:

- Lagrangian → Hamiltonian: v(q, p) solves ∂L/∂v(q, v) = p; H(q, p) = p·v − L(q, v).
- Hamiltonian → Lagrangian: p(q, v) solves ∂H/∂p(q, p) = v; L(q, v) = p·v − H(q, p).

**Quadratic in the velocity (the usual mechanical case).** Then ∂f/∂v is affine in v,
and one linear solve from v = 0 is exact: v = W⁻¹(p − ∂f/∂v(a, 0)) with W = ∂²f/∂v²(a, 0).
Whether f is quadratic in v is decided *structurally*, never by sampling: the Hessian
a, v ↦ ∂²f/∂v² is traced to a jaxpr and `geomjax.internal.sparsity.jacobian_pattern`
(sound: it never misses a dependence) must find no path from v to it. A Lagrangian it
cannot prove quadratic (a quartic term, a `where` on v, an operation the analysis treats
as dense) goes to Newton's method: correct either way, only slower.

**Otherwise** Newton's method (`geomjax.Newton`) from the one-solve guess, with exact
implicit derivatives. A solve that does not converge gives NaN, never a wrong finite value,
so a run through it is reported as failed by `geomjax.integrate`.

**Regularity.** The transform needs ∂²f/∂v² invertible. `check_regular` evaluates it at a
state (or at a fixed generic probe when no state is at hand) and raises a `ValueError`
naming the degenerate Lagrangian; inside compiled code a singular Hessian gives NaN.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._solve.linalg import small_solve
from .._solve.newton import Newton
from .._validate import known, require_invertible
from ..internal.sparsity import jacobian_pattern


def velocity_hessian(f: Callable, a, v):
    """∂²f/∂v²(a, v), shape (n, n), for f(a, v) with v of shape (n,)."""
    return jax.jacfwd(jax.grad(f, argnums=1), argnums=1)(a, v)


def _flatten_args(a, v):
    leaves = jax.tree_util.tree_leaves(a)
    sizes = [int(np.size(leaf)) for leaf in leaves]
    shapes = [jnp.shape(leaf) for leaf in leaves]
    treedef = jax.tree_util.tree_structure(a)

    def unflatten(x):
        out, start = [], 0
        for size, shape in zip(sizes, shapes):
            out.append(x[start : start + size].reshape(shape))
            start += size
        return jax.tree_util.tree_unflatten(treedef, out), x[start:]

    return sum(sizes), unflatten


def hessian_dependence(f: Callable, a, v) -> tuple[bool, bool]:
    """(depends on v, depends on a): whether ∂²f/∂v² can depend on v, and on a, read off
    the jaxpr (structural and sound: False means independent for every input).

    `a` and `v` only give shapes; their values are not used.
    """
    size_a, unflatten = _flatten_args(a, v)
    n = int(np.size(v))

    def hessian_of_flat(x):
        aa, vv = unflatten(x)
        return velocity_hessian(f, aa, vv).ravel()

    try:
        pattern = jacobian_pattern(hessian_of_flat, size_a + n)
    except Exception:  # a function the pattern analysis cannot trace: assume the worst
        return True, True
    return bool(pattern[:, size_a:].any()), bool(pattern[:, :size_a].any())


def solve_gradient(f: Callable, a, target, *, quadratic: bool, newton: Newton | None = None, guess=None):
    """v with ∂f/∂v(a, v) = target.

    `quadratic=True`: one linear solve from v = 0 (exact when ∂f/∂v is affine in v).
    Otherwise Newton's method from `guess` (default: that one-solve value); NaN if it does
    not converge.
    """
    grad_v = jax.grad(f, argnums=1)
    zero = jnp.zeros_like(target)
    if quadratic or guess is None:
        w = velocity_hessian(f, a, zero)
        first = small_solve(w, target - grad_v(a, zero))
        if quadratic:
            return first
        guess = first
    newton = Newton() if newton is None else newton
    sol = newton.solve(lambda v: grad_v(a, v) - target, guess)
    return jnp.where(sol.converged, sol.value, jnp.nan)


def probe_point(a_like, n: int, dtype=jnp.float64):
    """A fixed generic point (a, v) shaped like `a_like` and (n,): entries in (0.2, 0.7),
    distinct, so that no coordinate sits at a special value such as 0."""
    rng = np.random.default_rng(20240611)
    leaves = jax.tree_util.tree_leaves(a_like)
    new = [jnp.asarray(rng.uniform(0.2, 0.7, np.shape(leaf)), dtype) for leaf in leaves]
    a = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(a_like), new)
    return a, jnp.asarray(rng.uniform(0.2, 0.7, (n,)), dtype)


REGULAR_HINT = (
    "the Legendre transform p = ∂L/∂v cannot be solved for v (a degenerate Lagrangian, "
    "e.g. one linear in a velocity, or a velocity that does not appear). Give every "
    "velocity a regular kinetic term, or use a formulation for degenerate Lagrangians"
)


def check_regular(f: Callable, a, v, what: str, where: str, *, probe: bool = False) -> None:
    """Raise a ValueError if ∂²f/∂v²(a, v) is singular or non-finite (concrete values only).

    `what` names the function (e.g. "the velocity Hessian ∂²L/∂v²"), `where` the point.
    With `probe=True` the point is a generic probe, not a state of the user's: a
    non-finite Hessian there (the probe outside the function's domain) says nothing and
    is let through.
    """
    w = velocity_hessian(f, a, v)
    values = known(w)
    if values is None:
        return
    if probe and not np.all(np.isfinite(values)):
        return
    require_invertible(w, what, REGULAR_HINT, where)
