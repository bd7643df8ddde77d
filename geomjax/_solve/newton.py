"""Newton's method for the small implicit systems inside steps, with exact gradients.

Implicit steps (RATTLE multipliers, implicit Runge–Kutta stages, projections, discrete
Lagrange–d'Alembert) solve a few equations per step. Their solver settings live in one
place, the `Newton` module, which every implicit step stores.

Two back ends:

- `"unrolled"` (default): autodiff Jacobians and the unrolled `small_solve` (no LAPACK
  custom call inside the step), either a fixed number of iterations written out without a
  loop (`iterations=k`) followed by a convergence check, or a `lax.while_loop`
  (`iterations=None`). Derivatives follow the implicit function theorem
  (`jax.lax.custom_root`), never the iterations.
- `"optimistix"`: `optimistix.root_find` with `optimistix.Newton` and `ImplicitAdjoint`
  (lineax linear solves). Same flags out, same implicit gradients; slower on these tiny
  systems (see `benchmarks/rattle.py`), kept for comparison and for larger systems.
"""

from collections.abc import Callable
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .block_lu import BlockLUPlan
from .linalg import _UNROLL_MAX, small_solve


class NewtonResult(eqx.Module):
    """Solution of `fn(x) = 0`: `value` (pytree like the guess), `converged` (bool array),
    `iterations` (int array)."""

    value: object
    converged: jax.Array
    iterations: jax.Array


_BACKENDS = ("unrolled", "optimistix")


class Newton(eqx.Module):
    """Settings of the Newton solves inside implicit steps, and the solver itself.

    Newton's method for fn(x) = 0: x ← x − J(x)⁻¹ fn(x), J = ∂fn/∂x by forward-mode
    autodiff (or a fixed matrix given to `solve`, the simplified/chord iteration). The test
    for success is on the size of a Newton update measured in the units of the unknown,
    `|Δx|_∞ ≤ atol + rtol·|x|_∞`, where after a fixed number of iterations Δx is the update
    that the *final residual* fn(x_k) would give (the residual at the returned point, mapped
    through the last Jacobian): the returned point itself is checked, not its predecessor.
    Steps choose unknowns of a natural size (RATTLE solves for a displacement, implicit RK
    for stage increments), so these tolerances are meaningful at any step size.

    **Fields:**

    - `rtol`, `atol`: tolerances of the update test (≥ 0, not both 0 unless `iterations` is
      set, when a zero tolerance only makes `converged` stricter).
    - `max_steps`: the most iterations of the loop (`iterations=None`), ≥ 1; not used with
      a fixed `iterations`.
    - `iterations`: `None` (default) to iterate in a `lax.while_loop` until the update test
      holds or `max_steps` are spent; an integer k ≥ 1 to run exactly k iterations written
      out without a loop (they fuse with the rest of the step), then check the result: for
      k ≥ 2 by the error estimated from the last two updates, θ = |Δₖ|/|Δₖ₋₁|
      (θ²|Δₖ|/(1 − θ) times a safety factor of 1000 for Newton, whose first updates
      understate its constant; θ|Δₖ|/(1 − θ) for the chord iteration), for k = 1 by the
      update the residual at the result would give. A failed check gives
      `converged=False`; the value is not repaired, and steps report `NEWTON_FAILED`.
    - `then_loop`: with `iterations=k`, when the check after the k written-out
      iterations fails, go on in a `lax.while_loop` (up to `max_steps` iterations in
      all) instead of reporting the failure. The loop sits behind a `lax.cond` on the
      check (under `vmap`, one cond on "every member passed" for the whole batch), so
      steps keep the speed of the written-out iterations where they suffice and the
      reach of the loop where they do not.
    - `backend`: `"unrolled"` (default) or `"optimistix"` (`optimistix.root_find` with
      `optimistix.Newton`; `iterations` must then be `None`).
    - `sparse`: with the `"unrolled"` back end, solve systems of at least
      `geomjax._solve.block_lu.SPARSE_NEWTON_MIN` unknowns whose Jacobian is structurally
      sparse with a narrow band (read off the jaxpr at trace time: a cloth, a tree, a ring
      of rods) by block LU in a reverse Cuthill–McKee order (`BlockLUPlan`): c coloured
      forward products instead of a dense Jacobian, O(m·s²) work instead of O(m³).
      Default True; False keeps the dense Jacobian and solve at every size.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.newton import Newton
    >>> res = Newton(rtol=1e-14, atol=1e-14).solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    >>> print(f"{float(res.value[0]):.12f}", bool(res.converged))
    1.414213562373 True
    >>> res = Newton(iterations=2).solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    >>> bool(res.converged)  # two iterations from 1.0 are not enough for 1e-13
    False
    >>> res = Newton(iterations=2, then_loop=True).solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    >>> bool(res.converged)  # the loop finished the job
    True

    ```
    """

    rtol: float = eqx.field(static=True, default=1e-13)
    atol: float = eqx.field(static=True, default=1e-13)
    max_steps: int = eqx.field(static=True, default=25)
    iterations: int | None = eqx.field(static=True, default=None)
    backend: str = eqx.field(static=True, default="unrolled")
    then_loop: bool = eqx.field(static=True, default=False)
    sparse: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0.0 or value == float("inf"):
                raise ValueError(f"Newton {name} must be a finite number >= 0, got {value!r}")
        if self.iterations is None and self.rtol == 0.0 and self.atol == 0.0:
            raise ValueError("Newton needs rtol > 0 or atol > 0 to stop its loop (or a fixed iterations=k)")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"Newton max_steps must be an integer >= 1, got {self.max_steps!r}")
        if self.iterations is not None and (
            isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 1
        ):
            raise ValueError(f"Newton iterations must be None or an integer >= 1, got {self.iterations!r}")
        if self.backend not in _BACKENDS:
            raise ValueError(f"Newton backend must be one of {_BACKENDS}, got {self.backend!r}")
        if self.then_loop and self.iterations is None:
            raise ValueError("Newton then_loop=True continues after a fixed iterations=k: give iterations")
        if self.backend == "optimistix" and self.iterations is not None:
            raise ValueError("Newton(backend='optimistix') iterates in a loop: leave iterations=None")

    def small(self, dx, x):
        """The update test |dx|_∞ ≤ atol + rtol·|x|_∞ on flat arrays."""
        return jnp.max(jnp.abs(dx)) <= self.atol + self.rtol * jnp.max(jnp.abs(x))

    def solve(self, fn: Callable, guess, *, jacobian=None, inverse=None, structure=None, tangent=None) -> NewtonResult:
        """Solve `fn(x) = 0` from `guess` (a pytree of arrays; `fn(x)` has the same total size).

        `jacobian`, if given, is a fixed matrix (flat size × flat size, in the order of
        `ravel_pytree(guess)`) used instead of ∂fn/∂x in every iteration: the simplified
        Newton (chord) iteration, e.g. I − h A⊗J for implicit Runge–Kutta stages. The
        derivatives of the solution always use the exact ∂fn/∂x (implicit function
        theorem), whatever matrix drove the iteration.

        `inverse`, instead of `jacobian`: the inverse of a fixed matrix, applied to the
        residual as a matrix–vector product in every iteration (the same chord iteration
        with no linear solve inside the loop; for callers that invert the matrix once,
        e.g. by blocks), or a callable b ↦ J₀⁻¹b (e.g. solves with sparse factors).

        `structure`, instead: a trace-time plan of the exact Jacobian's sparsity (e.g. a
        `geomjax._solve.banded.TridiagonalJacobian` for the flat unknowns), with
        `structure.jacobian(f, y)` evaluating ∂f/∂y in its compressed form and
        `structure.solve(jac, b)` solving with it; used in every iteration and in the
        implicit-function tangent solve, so the derivatives see the same matrix. Ignored by
        `backend="optimistix"` (dense LU there).

        `tangent`: the implicit-function tangent solve `(g, b) ↦ J⁻¹b`, J the exact
        Jacobian of the linear map `g` (`jax.lax.custom_root`'s `tangent_solve`; it must be
        transposable for reverse mode). Default: J formed by `jax.jacfwd` and solved densely
        (or through `structure`). Large systems driven by a matrix-free `inverse` give a
        matrix-free one here, e.g. `geomjax._solve.krylov.krylov_tangent_solve`.

        Returns a `NewtonResult`; `converged` is False when the test failed or a value is
        not finite.
        """
        if sum(a is not None for a in (jacobian, inverse, structure)) > 1:
            raise ValueError("give one of a fixed jacobian, its inverse or a structure")
        if self.backend == "optimistix":
            if jacobian is not None or inverse is not None:
                raise ValueError("a fixed jacobian is only for backend='unrolled'")
            return _optimistix_solve(self, fn, guess)
        return _unrolled_solve(self, fn, guess, jacobian, inverse, structure, tangent)


def _unrolled_solve(settings: Newton, fn, guess, fixed_jacobian, fixed_inverse=None, structure=None, tangent=None):
    flat_guess, unravel = ravel_pytree(guess)

    def residual(y):
        return ravel_pytree(fn(unravel(y)))[0]

    if structure is None and fixed_jacobian is None and fixed_inverse is None and settings.sparse:
        # a large sparse Jacobian: factored by blocks in a bandwidth-reducing order
        structure = BlockLUPlan.for_newton(residual, int(flat_guess.shape[0]), flat_guess.dtype)

    def solve(g, y0):
        if fixed_inverse is not None:
            jac_of = lambda _: fixed_inverse  # noqa: E731
            if callable(fixed_inverse):  # a map b ↦ J₀⁻¹b (e.g. by sparse factors)
                linear_solve = lambda inv, b: inv(b)  # noqa: E731
            else:
                linear_solve = lambda inv, b: inv @ b  # noqa: E731
        elif structure is not None:
            jac_of = lambda y: structure.jacobian(g, y)  # noqa: E731
            linear_solve = structure.solve
        elif fixed_jacobian is None:
            jac_of = jax.jacfwd(g)
            linear_solve = small_solve
        else:
            jac_of = lambda _: fixed_jacobian  # noqa: E731
            if fixed_jacobian.shape[0] > _UNROLL_MAX:
                # Factor the fixed matrix once; every iteration then costs two triangular
                # solves instead of a new factorisation.
                factors = jax.scipy.linalg.lu_factor(fixed_jacobian)
                linear_solve = lambda _, b: jax.scipy.linalg.lu_solve(factors, b)  # noqa: E731
            else:
                linear_solve = small_solve
        def loop(y, k, done):
            def cond(carry):
                _, k, done, _ = carry
                return (k < settings.max_steps) & ~done

            def body(carry):
                y, k, _, _ = carry
                dy = linear_solve(jac_of(y), g(y))
                y_new = y - dy
                finite = jnp.all(jnp.isfinite(y_new))
                small = settings.small(dy, y_new)
                return y_new, k + 1, small | ~finite, finite & small

            y, k, _, ok = lax.while_loop(cond, body, (y, k, done, done))
            return y, k, ok

        if settings.iterations is None:
            y, k, ok = loop(y0, jnp.asarray(0), jnp.asarray(False))
        else:
            # A fixed count, written out without a loop (it fuses with the step), then a check.
            y, sizes = y0, []
            for _ in range(settings.iterations):
                jac = jac_of(y)
                dy = linear_solve(jac, g(y))
                y = y - dy
                sizes.append(jnp.max(jnp.abs(dy)))
            tol = settings.atol + settings.rtol * jnp.max(jnp.abs(y))
            if len(sizes) >= 2:
                # Error of the result estimated from the last two updates, no extra residual
                # evaluation: with θ = |Δₖ|/|Δₖ₋₁|, θ/(1 − θ)|Δₖ| for the linearly converging
                # chord iteration (fixed matrix; Hairer–Wanner IV.8) and θ²|Δₖ|/(1 − θ) for
                # Newton (quadratic: eₖ ≈ C|Δₖ|², C ≈ |Δₖ|/|Δₖ₋₁|²). θ ≥ 1 fails, unless both
                # updates are already within the tolerance (round-off after convergence).
                # Newton's C read off its first updates can be far below the C that governs
                # the last one (the first update, from a guess such as ν = 0, is not yet in
                # the quadratic regime): RATTLE on a 3-link chain at h = 0.03 accepted errors
                # 20× the estimate, |g| up to 4.3e−12. The Newton estimate is therefore taken
                # with a safety factor (`_NEWTON_ESTIMATE_SAFETY`); at small steps it is
                # many orders below the tolerance anyway (≈ 1e−24 for the spherical pendulum
                # at h = 1e−3), and where it is not, the loop finishes the solve.
                prev, last = sizes[-2], sizes[-1]
                theta = last / jnp.maximum(prev, jnp.finfo(y.dtype).tiny)
                chord = fixed_jacobian is not None or fixed_inverse is not None
                factor = jnp.ones_like(theta) if chord else _NEWTON_ESTIMATE_SAFETY * theta
                estimate = jnp.where(theta < 1.0, factor * theta / (1.0 - theta) * last, jnp.inf)
                estimate = jnp.where(last == 0.0, 0.0, estimate)
                ok = (estimate <= tol) | ((prev <= tol) & (last <= tol))
            else:
                # One iteration: the update that the residual at the result would give.
                ok = jnp.max(jnp.abs(linear_solve(jac, g(y)))) <= tol
            ok = ok & jnp.all(jnp.isfinite(y))
            k = jnp.asarray(settings.iterations)
            if settings.then_loop:
                # Runs only when the check failed (for some member, under vmap).
                if y.shape[0] <= _COND_FALLBACK_MAX:
                    y, k, ok = _skip_when_all_done(loop, y, k, ok)
                else:
                    y, k, ok = loop(y, k, ok)
        # custom_root differentiates aux too: pass it as floats (zero tangents).
        return y, jnp.stack([ok, k]).astype(y.dtype)

    if tangent is None:
        tangent = tangent_solve if structure is None else partial(structured_tangent_solve, structure)
    y, aux = lax.custom_root(residual, flat_guess, solve, tangent, has_aux=True)
    aux = lax.stop_gradient(aux)
    return NewtonResult(unravel(y), aux[0] > 0.5, aux[1].astype(jnp.int32))


#: The most unknowns for which `then_loop`'s fallback sits behind `_skip_when_all_done`
#: (a cond); larger solves keep the plain loop, which runs zero times when the check
#: passes. Measured on the planar chain of 16 links (k = 16, RATTLE in a scan, one
#: trajectory) with a three-scan Thomas solve: 12.0 µs/step with the cond, 2.4 with the
#: loop; with the cond the step's loop crossed XLA's small-loop size
#: (`geomjax._config.SMALL_LOOP_BYTES`; 2.3 µs with a 4 MiB threshold) and ran kernel by
#: kernel.
_COND_FALLBACK_MAX = _UNROLL_MAX
# The factor on Newton's error estimate θ²|Δₖ|/(1 − θ) in the check after written-out
# iterations (see `solve`): over 24 000 RATTLE steps of a 3-link chain at h = 0.03 the
# true error of the accepted solves was up to 20× the estimate with no factor, 0.9× the
# tolerance with 10, at round-off (6e−16) with 1000.
_NEWTON_ESTIMATE_SAFETY = 1000.0


def _skip_when_all_done(run, y, k, ok):
    """`run(y, k, ok)` (the loop that finishes a solve) only when `ok` is False.

    Unbatched, a `lax.cond`. Under `vmap`, one `lax.cond` on "every member is ok" (an
    unbatched predicate: one test for the whole batch) around the batched loop, instead
    of the batched loop alone: a batched `while` makes its whole carry (1024 copies of
    the solve's closure) into loop buffers on every step and splits the fused step
    around them, even when it runs zero times. Spherical pendulum, RATTLE step in a scan,
    `vmap` over 1024 states, one process (`benchmarks/rattle.py` step): 17.3 µs/step with
    the batched loop, 11.0 with the cond, 8.0 with no fallback at all, 7.2 for the hand
    fixed-iteration step. Unbatched, the cond ran a step as fast as the zero-trip loop
    (50.6 vs 48.8 ns), the loop inside `custom_vmap` at 90.8 ns.
    """
    # Every value `run` closes over becomes an explicit argument, so the batching rule
    # sees which of them are batched.
    closed = jax.make_jaxpr(run)(y, k, ok)
    consts = list(closed.consts)

    def converted(y, k, ok, *consts):
        return tuple(jax.core.eval_jaxpr(closed.jaxpr, consts, y, k, ok))

    @jax.custom_batching.custom_vmap
    def finish(consts, y, k, ok):
        return lax.cond(ok, lambda: (y, k, ok), lambda: converted(y, k, ok, *consts))

    @finish.def_vmap
    def rule(axis_size, in_batched, consts, y, k, ok):
        consts_batched, *args_batched = in_batched
        args = [a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a)) for a, b in zip((y, k, ok), args_batched)]
        axes = [0 if b else None for b in consts_batched]
        batched = jax.vmap(lambda yy, kk, oo, cc: converted(yy, kk, oo, *cc), in_axes=(0, 0, 0, axes))
        out = lax.cond(jnp.all(args[2]), lambda a, c: tuple(a), lambda a, c: batched(*a, c), args, consts)
        return out, (True, True, True)

    return finish(consts, y, k, ok)


def tangent_solve(g, b):
    """`lax.custom_root`'s tangent solve: J⁻¹b with J the exact Jacobian of the linear map
    `g` (derivatives by the implicit function theorem, whatever iteration found the root)."""
    return small_solve(jax.jacfwd(g)(jnp.zeros_like(b)), b)


def structured_tangent_solve(structure, g, b):
    """`tangent_solve` with the Jacobian of the linear map `g` evaluated and solved through
    `structure` (the plan that drove the iterations)."""
    return structure.solve(structure.jacobian(g, jnp.zeros_like(b)), b)


def _optimistix_solve(settings: Newton, fn, guess):
    import lineax as lx
    import optimistix as optx

    solver = optx.Newton(rtol=settings.rtol, atol=settings.atol, linear_solver=lx.LU())
    sol = optx.root_find(
        lambda y, _: fn(y),
        solver,
        guess,
        throw=False,
        max_steps=settings.max_steps,
        adjoint=optx.ImplicitAdjoint(linear_solver=lx.LU()),
    )
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(sol.value)]))
    converged = (sol.result == optx.RESULTS.successful) & finite
    return NewtonResult(sol.value, converged, jnp.asarray(sol.stats["num_steps"], jnp.int32))


def as_newton(newton: Newton | None, rtol=None, atol=None, max_iter=None, *, default: Newton | None = None) -> Newton:
    """The `Newton` a step stores: `newton` if given, else `default` with the old keyword
    arguments `rtol`, `atol`, `max_iter` (= `max_steps`, and a loop) put in where given."""
    legacy = {k: v for k, v in (("rtol", rtol), ("atol", atol), ("max_steps", max_iter)) if v is not None}
    if newton is not None:
        if not isinstance(newton, Newton):
            raise TypeError(f"newton must be a geomjax.Newton, got {type(newton).__name__}")
        if legacy:
            raise ValueError("give either newton=Newton(...) or rtol/atol/max_iter, not both")
        return newton
    base = Newton() if default is None else default
    if "max_steps" in legacy:
        legacy["iterations"] = None  # an iteration limit asks for the loop
        legacy["then_loop"] = False
    return _replace(base, **legacy) if legacy else base


def _replace(n: Newton, **changes) -> Newton:
    fields = dict(
        rtol=n.rtol, atol=n.atol, max_steps=n.max_steps, iterations=n.iterations, backend=n.backend,
        then_loop=n.then_loop, sparse=n.sparse,
    )
    fields.update(changes)
    return Newton(**fields)


def newton_solve(
    fn: Callable,
    guess,
    *,
    rtol: float = 1e-13,
    atol: float = 1e-13,
    max_iter: int = 25,
) -> NewtonResult:
    """Solve `fn(x) = 0` by Newton's method in a loop: `Newton(rtol, atol, max_iter).solve`.

    Kept for callers of the earlier function; see `Newton` for the settings.

    Example:

    ```python
    res = newton_solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    res.value  # [1.41421356]
    ```
    """
    return Newton(rtol=rtol, atol=atol, max_steps=max_iter).solve(fn, guess)
