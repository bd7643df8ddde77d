"""RATTLE and SHAKE for holonomically constrained Hamiltonian systems, derived by autodiff.

For H(q, p) = ½pᵀM(q)⁻¹p + U(q) on T*Rⁿ with k position constraints g(q) = 0
(G = Dg, k × n), the constrained equations of motion are

    q̇ = ∂H/∂p,   ṗ = −∂H/∂q − G(q)ᵀλ,   g(q) = 0,

and the phase space is S = {g(q) = 0, G(q)∂H/∂p = 0} (the position constraints and their
hidden velocity constraints). Everything the steps need, ∂H/∂q, ∂H/∂p, g, Gᵀλ and G v,
comes from autodiff of the user's `hamiltonian` and `holonomic` functions; multipliers
come from Newton's method (`geomjax.Newton`), so derivatives of a step are exact (implicit function theorem).

Many constraints that each couple a few neighbouring bodies make the Newton matrix
G(q₁)M⁻¹G(q)ᵀ and the projection matrix G M⁻¹Gᵀ sparse. Their pattern is read off the
jaxpr of the residuals at trace time (`geomjax.internal.sparsity`). A chain makes them
tridiagonal: they then come from three Jacobian-vector products with coloured seeds
instead of k, and are solved in O(k) (`geomjax._solve.banded`). Any other sparse graph (a
cloth, a tree, a ring, a molecule) of at least `SPARSE_MIN_CONSTRAINTS` constraints is
solved matrix-free (`geomjax._solve.krylov`): conjugate gradients on G M⁻¹Gᵀ with
products by `jax.vjp`/`jax.jvp` (O(nnz) each), a Jacobi preconditioner read off a few
coloured products, and a chord iteration for the position constraints; nothing of size
k × k is formed. Small or dense patterns keep the dense path.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._solve.banded import TridiagonalJacobian
from .._solve.block_cholesky import BlockCholeskyPlan, direct_band_limit
from .._solve.krylov import (
    EXACT_RTOL,
    INNER_RTOL,
    GramPlan,
    PreconditionedCG,
    chord_solve,
    pcg,
    relative_residual,
    residual_bound,
    symmetric_solve,
)
from .._solve.linalg import small_solve
from .._solve.newton import Newton, as_newton
from .._status import RESULTS, where_first
from ..internal.simplify import scalar_graph
from ..internal.sparsity import jacobian_sparsity
from .base import SystemStep
from .._system.system import HolonomicSystem, System
from .._validate import as_state, known_tree


class _Mechanics(eqx.Module):
    """H, its partial gradients and the constraint map g with its transposed Jacobian,
    evaluated on the pieces (q, p) of a canonical state."""

    system: System

    def energy(self, q, p):
        return self.system.structure.evaluate(self.system.hamiltonian, (q, p))

    def dh_dq(self, q, p):
        return jax.grad(self.energy, argnums=0)(q, p)

    def dh_dp(self, q, p):
        return jax.grad(self.energy, argnums=1)(q, p)

    def g(self, q):
        return jnp.atleast_1d(self.system.holonomic(q))

    def g_and_transpose(self, q):
        """g(q) and the map λ ↦ G(q)ᵀλ (one reverse pass, reused for every λ)."""
        value, pullback = jax.vjp(self.g, q)
        return value, lambda lam: pullback(lam)[0]

    def g_transpose(self, q, lam):
        """G(q)ᵀλ by a reverse pass taken where it is used: inside a residual, the sparsity
        analysis then reads G's pattern (a pullback closed over from outside is opaque)."""
        return jax.vjp(self.g, q)[1](lam)[0]

    def g_dot(self, q, v):
        """G(q)v, the rate of change of g along the velocity v."""
        return jax.jvp(self.g, (q,), (v,))[1]


def _momentum_projection(mech: _Mechanics, q1, p_free, h, plan=None, precondition=None, report=False):
    """The RATTLE velocity stage: μ such that p₁ = p_free − (h/2)G(q₁)ᵀμ satisfies the hidden
    constraint G(q₁)∂H/∂p(q₁, p₁) = 0. Returns `(p₁, converged)` (with `report` on a sparse
    plan, the relative residual ‖b − Aμ‖/‖b‖ of its solve instead).

    For a kinetic energy quadratic in p the residual is affine in μ, so one linear solve
    (A μ = −r(0) with A = ∂r/∂μ = −(h/2)G M⁻¹Gᵀ by forward mode) is exact; no iteration is
    needed. `plan` (`_structure`): with a `TridiagonalJacobian`, A comes from three forward
    products with coloured seeds and a tridiagonal solve; with a `BlockCholeskyPlan`,
    from c coloured products into RCM-ordered blocks and a block Cholesky factorization;
    with a `GramPlan`, conjugate gradients on −A, products by forward mode, never formed
    (`converged` is the linear solve's). `precondition` (r ↦ P⁻¹r, the position stage's
    factors of a nearby matrix): conjugate gradients preconditioned by it instead of a new
    factorization.
    """
    _, transpose = mech.g_and_transpose(q1)

    def momentum(mu):
        return p_free - 0.5 * h * transpose(mu)

    def residual(mu):
        return mech.g_dot(q1, mech.dh_dp(q1, momentum(mu)))

    k = mech.g(q1).shape[0]
    zero = jnp.zeros((k,), p_free.dtype)
    done = jnp.asarray(True)
    if isinstance(plan, _SPARSE_PLANS):
        r0, linear = jax.linearize(residual, zero)
        positive = lambda v: -linear(v)  # (h/2) G M⁻¹Gᵀ: symmetric positive definite
        if precondition is not None:
            mu, ok = symmetric_solve(positive, r0, PreconditionedCG, precondition)
        else:
            mu, ok = symmetric_solve(positive, r0, plan, plan.prepare(positive, zero.dtype))
        if report:  # the relative residual of the solve instead (`Rattle.linear_residuals`)
            return relative_residual(positive, r0, mu)
        return momentum(mu), ok
    if plan is not None:
        r0, linear = jax.linearize(residual, zero)
        return momentum(-plan.solve(plan.of_linear(linear, zero.dtype), r0)), done
    r0 = residual(zero)
    a = jax.jacfwd(residual)(zero)
    mu = -small_solve(a, r0)
    return momentum(mu), done


def _structure(residual, zero, choice=None):
    """A plan for the k × k Jacobian of `residual` (flat, k = zero.size), from its structural
    pattern read off the jaxpr at trace time, or None (dense):

    - a `TridiagonalJacobian` when the pattern is tridiagonal (a chain) and k exceeds the
      sizes handled densely (`_SIMPLIFIED_CONSTRAINTS`);
    - for another sparse pattern of at least `SPARSE_MIN_CONSTRAINTS` rows, a
      `BlockCholeskyPlan` (RCM order, block Cholesky) when its band is at most
      `direct_band_limit(k)` = max(96, 2√k), else a `GramPlan` (conjugate gradients).

    `choice`: None (the above), "krylov" or "banded" (that sparse plan at any k where the
    pattern is sparse), False (never a sparse plan beyond the chain's)."""
    k = zero.shape[0]
    if choice is None and k <= _SIMPLIFIED_CONSTRAINTS:
        return None
    try:
        pattern = jacobian_sparsity(residual, k, zero.dtype)  # read once, for every plan
    except Exception:  # an analysis that cannot trace: dense
        return None
    if pattern.size != k or pattern.n != k:
        return None
    if choice is None or choice is False:
        # a chain: tridiagonal (its k × k pattern is read densely, as the plan needs it)
        plan = TridiagonalJacobian.from_pattern(pattern.dense()) if pattern.bandwidth() <= 1 else None
        if plan is not None or choice is False or k < SPARSE_MIN_CONSTRAINTS:
            return plan
    if choice == "krylov":
        return GramPlan.from_pattern(pattern)
    if choice == "banded":
        return BlockCholeskyPlan.from_pattern(pattern)
    # blocks against warm-started CG on the band a border leaves: a random tree of 1023 rods
    # (plain RCM band 128, CG before) now factors by blocks, band 51: 3.3 against 5.0 ms per step
    return BlockCholeskyPlan.from_pattern(pattern, direct_band_limit(k)) or GramPlan.from_pattern(pattern)


_SPARSE_PLANS = (GramPlan, BlockCholeskyPlan)


class Rattle(SystemStep):
    """RATTLE (`velocity_projection=True`) or SHAKE (`False`) for a holonomic `System`.

    See `geomjax.rattle` and `geomjax.shake` for the equations.
    """

    system: System
    separable: bool = eqx.field(static=True)
    velocity_projection: bool = eqx.field(static=True)
    newton: Newton
    structured: bool | str = eqx.field(static=True, default=True)
    refactor_every: int | None = eqx.field(static=True, default=None)

    @property
    def _mech(self):
        return _Mechanics(self.system)

    # --- factors of G M⁻¹Gᵀ carried from step to step (`refactor_every`) ----------------
    @property
    def carries_history(self) -> bool:
        return self.refactor_every is not None

    def merge(self, z):
        return super().merge(tuple(z[:2]) if self.refactor_every is not None else z)

    def _gram(self, q, p, h):
        """v ↦ G(q)M⁻¹G(q)ᵀv (products by one jvp and one vjp of g)."""
        mech = self._mech
        _, g_lin = jax.linearize(mech.g, q)
        _, pullback = jax.vjp(mech.g, q)
        return lambda v: g_lin(jax.jvp(lambda pp: mech.dh_dp(q, pp), (p,), (pullback(v)[0],))[1])

    def _block_plan(self, q, p, h):
        plan = self._plan(q, p, h) if self.separable else None
        return plan if isinstance(plan, BlockCholeskyPlan) and self.newton.backend == "unrolled" else None

    def _fresh_factors(self, q, p, h, plan):
        return plan.prepare(self._gram(q, p, h), p.dtype)

    def start(self, t0, z0, h, args):
        """With `refactor_every`, the loop carries (q, p, factors of G M⁻¹Gᵀ, their age in
        steps); empty factors where the step has no block plan."""
        if self.refactor_every is None:
            return z0
        q, p = z0[0], z0[1]
        plan = self._block_plan(q, p, h)
        factors = () if plan is None else self._fresh_factors(q, p, jnp.asarray(h, p.dtype), plan)
        return (q, p, factors, jnp.zeros((), jnp.int32))

    def check(self, x0) -> None:
        check_holonomic_start(self.system, x0, need_separable=self.separable)

    def _solve(self, fn, guess):
        return self.newton.solve(fn, guess)

    def _plan(self, q, p, h):
        """The trace-time plan (`_structure`) for the k × k matrices of this step, G(q₁)M⁻¹G(q)ᵀ
        and G M⁻¹Gᵀ (one sparsity pattern), or None for the dense path."""
        if not self.structured:
            return None
        mech = self._mech

        def probe(nu):
            # ν ↦ g(q + h∂H/∂p(q, p − G(q)ᵀν)): its Jacobian has the pattern of G M⁻¹Gᵀ. The
            # reverse pass of g is taken inside, so index arrays the constraints gather with
            # are constants of the traced graph, which the analysis reads (taken outside,
            # they would be values of the enclosing trace, and read as dense).
            _, pullback = jax.vjp(mech.g, q)
            return mech.g(q + h * mech.dh_dp(q, p - pullback(nu)[0]))

        zero = jnp.zeros(jax.eval_shape(lambda qq: mech.g(qq), q).shape, p.dtype)
        return _structure(probe, zero, _KRYLOV_CHOICE[self.structured])

    # The unknown multiplier is scaled as ν = (h²/2)λ, a displacement: ∂q₁/∂ν = −M⁻¹Gᵀ is
    # O(1), so Newton's update test |Δν| ≤ atol + rtol|ν| is meaningful at any h (in λ
    # itself round-off in g(q₁) is amplified by 1/h²).

    def _position_map(self, q, p, h, force=None):
        """ν ↦ (q₁, p½) of the separable position stage, p½ = p − (h/2)∇U(q) − G(q)ᵀν/h,
        q₁ = q + h ∂H/∂p(p½); and the zero multiplier. `force`: ∇U(q) if the caller has it."""
        mech = self._mech
        kick = p - 0.5 * h * (mech.dh_dq(q, p) if force is None else force)
        g0, transpose = mech.g_and_transpose(q)

        def advance(nu):
            p_half = kick - transpose(nu) / h
            return q + h * mech.dh_dp(q, p_half), p_half

        return advance, jnp.zeros_like(g0)

    def _chord_parts(self, q, advance, zero):
        """q₁(0), the linear map ν ↦ q₁(ν) − q₁(0) = −M⁻¹G(q)ᵀν, and v ↦ A₀v = G(q)M⁻¹G(q)ᵀv."""
        q_free, shift = jax.linearize(lambda nu: advance(nu)[0], zero)
        _, g_lin = jax.linearize(self._mech.g, q)
        return q_free, shift, lambda v: -g_lin(shift(v))

    def linear_residuals(self, x, h):
        """What the step's sparse linear solves reach at the state `x` (the diagnosis of a
        run that ended with `RESULTS.linear_solve_failed`, repeated at its last good state).

        Returns `(solver, rows)` with `solver` "conjugate gradients" or "block Cholesky"
        and `rows` a tuple of `(stage, relative residual ‖b − A y‖/‖b‖, bound)`: the
        position stage's first correction with A₀ = G(q)M⁻¹G(q)ᵀ, b = g(q₁(0)) (bound: its
        inner tolerance), and the velocity stage's solve with G(q₁)M⁻¹G(q₁)ᵀ at the q₁ the
        step reaches (bound: the exact solves' true-residual test); or None where the step
        has no sparse plan (its solves are dense).
        """
        q, p = self.split(x)[:2]
        h = jnp.asarray(h, p.dtype)
        plan = self._plan(q, p, h) if self.separable else None
        if not isinstance(plan, _SPARSE_PLANS):
            return None
        mech = self._mech
        advance, zero = self._position_map(q, p, h)
        q_free, _, gram = self._chord_parts(q, advance, zero)
        b = mech.g(q_free)
        prepared = plan.prepare(gram, zero.dtype)
        correction = plan.apply_inverse(prepared, gram, b, INNER_RTOL)[0]
        rows = [("position", relative_residual(gram, b, correction), residual_bound(INNER_RTOL))]
        if self.velocity_projection:
            q1, p_half, _, _ = self._position_stage_separable(q, p, h, plan)
            p_free = p_half - 0.5 * h * mech.dh_dq(q1, p_half)
            rel = _momentum_projection(mech, q1, p_free, h, plan, report=True)
            rows.append(("velocity", rel, residual_bound(EXACT_RTOL)))
        solver = "block Cholesky" if isinstance(plan, BlockCholeskyPlan) else "conjugate gradients"
        return solver, tuple(rows)

    def _position_stage_separable(self, q, p, h, plan, factors=None, force=None):
        """p½ = p − (h/2)∇U(q) − G(q)ᵀν/h, q₁ = q + h ∂H/∂p(p½), g(q₁) = 0: Newton in ν (k
        unknowns). `factors`: block factors of G M⁻¹Gᵀ to use for A₀ instead of factoring
        at q (carried from an earlier step); `force`: ∇U(q) if the caller has it."""
        mech = self._mech
        advance, zero = self._position_map(q, p, h, force)
        # ∂H/∂p is linear in p (checked), so q₁(ν) = q₁(0) + Dν is affine.
        if isinstance(plan, _SPARSE_PLANS):
            # A sparse graph: ν ← ν + A₀⁻¹g(q₁(ν)), A₀ = G(q)M⁻¹G(q)ᵀ by a block Cholesky
            # factorization (narrow band) or conjugate gradients (never formed), products by
            # one jvp and one vjp of g.
            q_free, shift, gram = self._chord_parts(q, advance, zero)
            prepared = plan.prepare(gram, zero.dtype) if factors is None else factors
            inv_diag = plan.inverse_diagonal(prepared)

            def chord_step(r, rtol):
                x, ok = plan.apply_inverse(prepared, gram, r, rtol)
                return -x, ok

            # the update test on what moves q₁ (Δq₁ = shift(Δν)) against the size of q
            scale = jnp.maximum(jnp.max(jnp.abs(q)), jnp.max(jnp.abs(q_free)))
            res, linear_ok = chord_solve(lambda nu: mech.g(q_free + shift(nu)), zero, chord_step, self.newton,
                                         inv_diag, measure=shift, scale=scale)
            q1, p_half = advance(res.value)
            # a failed iteration whose last correction did not converge is the linear solve's failure
            res = eqx.tree_at(lambda r: r.converged, res, res.converged & linear_ok)
            if isinstance(plan, BlockCholeskyPlan):
                # A₀'s factors precondition the velocity stage's G(q₁)M⁻¹G(q₁)ᵀ (h/2 apart)
                precondition = lambda v: (2.0 / h) * plan.solve(prepared, v)
                return q1, p_half, res, (linear_ok, precondition)
            return q1, p_half, res, linear_ok
        if plan is not None:
            # The Newton matrix G(q₁)D = −G(q₁)M⁻¹G(q)ᵀ is tridiagonal (a chain): D stays a
            # linear map, and each iteration takes three jvps of g (coloured seeds) and a
            # tridiagonal solve, in the iterations and in the implicit-function tangent solve.
            q_free, shift = jax.linearize(lambda nu: advance(nu)[0], zero)
            res = self.newton.solve(lambda nu: mech.g(q_free + shift(nu)), zero, structure=plan)
            q1, p_half = advance(res.value)
            return q1, p_half, res, True
        # Dense: D is computed once (k forward passes) and each Newton iteration only
        # evaluates g and its jvp.
        q_free = advance(zero)[0]
        cols = jax.vmap(lambda e: jax.jvp(lambda nu: advance(nu)[0], (zero,), (e,))[1])(jnp.eye(zero.shape[0], dtype=zero.dtype))
        res = self._solve(lambda nu: mech.g(q_free + nu @ cols), zero)
        q1, p_half = advance(res.value)
        return q1, p_half, res, True

    def _position_stage_general(self, q, p, h):
        """The generalised leapfrog with constraint: unknowns (p½, q₁, ν), 2n + k of them."""
        mech = self._mech

        def residual(unknowns):
            p_half, q1, nu = unknowns
            r_p = h * (p_half - p + 0.5 * h * mech.dh_dq(q, p_half)) + mech.g_transpose(q, nu)
            r_q = q1 - q - 0.5 * h * (mech.dh_dp(q, p_half) + mech.dh_dp(q1, p_half))
            return r_p, r_q, mech.g(q1)

        guess = (p, q + h * mech.dh_dp(q, p), jnp.zeros_like(mech.g(q)))
        res = self._solve(residual, guess)
        p_half, q1, _ = res.value
        return q1, p_half, res

    def advance(self, t, z, h, args):
        del t, args
        # Through the simplified scalar graph, as derived fields are (`geomjax.internal.
        # simplify`; the Newton fallback loop is kept whole inside it), for up to
        # `_SIMPLIFIED_CONSTRAINTS` constraints: the spherical pendulum (k = 1) and the
        # chain of 2 links (k = 2) run faster so, the chain of 4 (k = 4, 4 × 4 solves
        # written out) slower and compiles longer (benchmarks/rattle.py,
        # chain_scaling.py), so larger systems run as derived.
        if self.refactor_every is not None:
            return self._advance_reusing(z, jnp.asarray(h, z[1].dtype))
        k = jax.eval_shape(lambda q: self._mech.g(q), z[0]).shape[0]
        if k <= _SIMPLIFIED_CONSTRAINTS:
            return scalar_graph(self._advance, z, h, enabled=self.simplify)
        return self._advance(z, h)

    def _advance_reusing(self, z, h):
        """One step with the carried factors of G M⁻¹Gᵀ (`refactor_every`): refreshed when
        they are `refactor_every` steps old, and where the chord iteration with the old ones
        fails (the step is then redone with fresh factors, so a failure is never the old
        factors')."""
        q, p, factors, age = z
        plan = self._block_plan(q, p, h)
        if plan is None:
            out, status = self._advance((q, p), h)
            return (*out, factors, age), status
        fresh = lambda: self._fresh_factors(q, p, h, plan)  # noqa: E731
        stale = age >= self.refactor_every
        factors = lax.cond(stale, fresh, lambda: factors)
        age = jnp.where(stale, 0, age)
        out, status = self._advance((q, p), h, factors, plan)

        def redo():
            new = fresh()
            again, again_status = self._advance((q, p), h, new, plan)
            return again, again_status, new, jnp.zeros_like(age)

        keep = (status == RESULTS.successful) | (age == 0)
        out, status, factors, age = lax.cond(keep, lambda: (out, status, factors, age), redo)
        return (*out, factors, age + 1), status

    def _advance(self, z, h, factors=None, plan=None):
        return self._advance_composed(z, (h,), factors, plan)

    def _advance_composed(self, z, hs, factors=None, plan=None):
        """RATTLE steps of sizes `hs` in turn (one step: `hs = (h,)`), with what consecutive
        steps share computed once. Between two separable RATTLE steps the velocity
        projection p₁ = p_free − G(q₁)ᵀμ is left out and ∇U(q₁) is reused: the next step's
        first kick p½ = p₁ − (h'/2)∇U(q₁) − G(q₁)ᵀν/h' adds another multiple of the same
        G(q₁)ᵀ, and its multiplier, fixed by g(q₂) = 0 alone, takes up both (the same map,
        to round-off, with one velocity solve and one force evaluation fewer per joint)."""
        q, p = z[0], z[1]
        mech = self._mech
        h = hs[0]
        plan = self._plan(q, p, h) if plan is None else plan
        fused = self.separable and self.velocity_projection
        force = mech.dh_dq(q, p) if fused else None
        status = RESULTS.successful
        for i, h in enumerate(hs):
            last = i == len(hs) - 1
            position_ok, precondition = True, None
            if self.separable:
                q1, p_half, res, position_ok = self._position_stage_separable(
                    q, p, h, plan if self.newton.backend == "unrolled" else None, factors, force)
                if isinstance(position_ok, tuple):
                    position_ok, precondition = position_ok
            else:
                q1, p_half, res = self._position_stage_general(q, p, h)
            force = mech.dh_dq(q1, p_half)
            p_free = p_half - 0.5 * h * force
            velocity_ok = jnp.asarray(True)
            if fused and not last:
                p1 = p_free  # projected by the next step's multiplier (above)
            elif self.velocity_projection:
                p1, velocity_ok = _momentum_projection(mech, q1, p_free, h, plan, precondition)
            else:
                # SHAKE: the second half-kick reuses λ = 2ν/h², so only positions are constrained.
                nu = res.value if self.separable else res.value[2]
                p1 = p_free - mech.g_and_transpose(q1)[1](nu) / h
            # The first failure names the cause: the position stage's linear solves, then its
            # iteration (no solution near the predictor: the velocity stage then works on
            # garbage, and its failure is not the cause), then the velocity stage's solve.
            step_status = RESULTS.where(velocity_ok, RESULTS.successful, RESULTS.linear_solve_failed)
            step_status = RESULTS.where(res.converged, step_status, RESULTS.newton_failed)
            step_status = RESULTS.where(jnp.asarray(position_ok), step_status, RESULTS.linear_solve_failed)
            status = step_status if i == 0 else where_first(status, step_status)
            q, p, factors = q1, p1, None
        return (q, p), status


class RattleComposition(SystemStep):
    """Φ_h = R_{c_m h} ∘ … ∘ R_{c_1 h} for a separable RATTLE step R (e.g. the triple jump,
    order 4), with each joint between two sub-steps fused: the velocity projection there is
    left out and ∇U reused (`Rattle._advance_composed`; the same map to round-off). Built by
    `geomjax.compose` / `geomjax.triple_jump` of one such step."""

    rattle: Rattle
    coefficients: tuple = eqx.field(static=True)

    @property
    def system(self):
        return self.rattle.system

    def check(self, x0) -> None:
        self.rattle.check(x0)

    def advance(self, t, z, h, args):
        del t, args
        h = jnp.asarray(h, z[1].dtype)
        k = jax.eval_shape(lambda q: self.rattle._mech.g(q), z[0]).shape[0]
        run = lambda z, h: self.rattle._advance_composed(z, tuple(c * h for c in self.coefficients))  # noqa: E731
        if k <= _SIMPLIFIED_CONSTRAINTS:
            return scalar_graph(run, z, h, enabled=self.simplify and self.rattle.simplify)
        return run(z, h)

    @staticmethod
    def fuses(step) -> bool:
        """Whether compositions of `step` fuse (separable RATTLE without carried factors)."""
        return (isinstance(step, Rattle) and step.separable and step.velocity_projection
                and step.refactor_every is None)


#: Newton iterations RATTLE and SHAKE write out by default, before the convergence check;
#: when the check fails a loop goes on (`Newton(then_loop=True)`). Two reach round-off from
#: ν = 0 up to h ≈ 0.01 on the spherical pendulum; beyond, the loop finishes the solve.
#: Spherical pendulum, h = 1e-3, interleaved best-of-7 (`benchmarks/rattle.py`), ns/step:
#: 2 written out 44.6–44.8, 2 + loop 48.7–50.8, 3 written out 54.7; hand-written with 2
#: fixed iterations and no check 31.3. `Newton(iterations=2)` (no loop) is the fast choice
#: for runs known to stay at small h: a failed check is then reported, not repaired.
RATTLE_ITERATIONS = 2

#: The most constraints for which a RATTLE step goes through the simplification pass.
_SIMPLIFIED_CONSTRAINTS = 2
#: The fewest constraints for which a sparse pattern that is not a chain gets a sparse plan
#: rather than the dense path. Measured (benchmarks/constraint_scaling_results.txt, RATTLE
#: per step): dense 45 against 63 µs at m = 28 (cloth 4 × 4) and 45 against 54 µs at m = 24
#: (two molecules); sparse 119–135 against 396–411 µs at m = 66–67 (tree, ring).
SPARSE_MIN_CONSTRAINTS = 40
# `structured` → the `choice` argument of `_structure`.
_KRYLOV_CHOICE = {True: None, "krylov": "krylov", "banded": "banded"}


def _rattle_newton(newton, rtol, atol, max_iter, separable=True):
    # The general form solves for (p½, q₁, ν) from a cruder guess: it keeps the loop.
    default = Newton(iterations=RATTLE_ITERATIONS, then_loop=True) if separable else Newton()
    return as_newton(newton, rtol, atol, max_iter, default=default)


def _require_holonomic(system, name):
    if not isinstance(system, System):
        raise TypeError(f"{name} needs a geomjax.System, got {type(system).__name__}")
    if not isinstance(system, HolonomicSystem):
        raise ValueError(
            f"{name} needs position constraints: build the System with holonomic=g(q) "
            "(e.g. geomjax.models.spherical_pendulum(holonomic=True)); a general "
            "second-class set constraints=f(x) does not say which constraints act on q"
        )


#: Above this many coordinates the start checks take products instead of dense Jacobians
#: (an n × n or k × n matrix, and the SVD of G M⁻¹Gᵀ, grow like n²–n³: a 64 × 64 cloth has
#: 8192 coordinates and 8066 constraints).
_DENSE_START_CHECK = 512


@eqx.filter_jit
def _start_quantities(system: System, x0, dense: bool):
    """Everything `check_holonomic_start` inspects, computed in one compiled call (`dense`:
    with dense Jacobians, else by products)."""
    mech = _Mechanics(system)
    q, p = system.structure.split(x0)
    n = q.shape[0]
    # Fixed, generic probe directions for the structural checks on H.
    probe = jnp.cos(1.0 + 2.3 * jnp.arange(n, dtype=p.dtype))
    shift = jnp.sin(0.7 + 1.9 * jnp.arange(n, dtype=q.dtype))
    scale = 1.0 + jnp.max(jnp.abs(p))
    v0 = mech.dh_dp(q, p)
    v1 = mech.dh_dp(q, p + scale * probe)
    curvature = jax.jvp(lambda pp: mech.dh_dp(q, pp), (p,), (scale * probe,))[1]
    # Probe away from x0 as well: at special points (p = 0, symmetric q) the mixed
    # derivative of ½pᵀM(q)⁻¹p can vanish although M depends on q.
    points = (q, q + 0.25 * (1.0 + jnp.max(jnp.abs(q))) * shift)
    out = dict(g=mech.g(q), gdot=mech.g_dot(q, v0), linear_gap=v1 - v0 - curvature,
               linear_scale=jnp.max(jnp.abs(curvature)), scale=scale)
    if dense:
        mixed = [jax.jacfwd(lambda qv: mech.dh_dp(qv, p + scale * probe))(qq) for qq in points]
        jac = jax.jacfwd(mech.g)(q)
        minv = jax.jacfwd(lambda pp: mech.dh_dp(q, pp))(p)
        out.update(mixed=jnp.max(jnp.abs(jnp.stack(mixed))), gram=jac @ minv @ jac.T)
    else:
        # Products only: ∂/∂q(∂H/∂p) along two generic directions, and the independence of
        # the constraints by conjugate gradients on G M⁻¹Gᵀ with a generic right-hand side
        # (a singular matrix leaves a residual in its null space that CG cannot remove).
        mixed = [jax.jvp(lambda qv: mech.dh_dp(qv, p + scale * probe), (qq,), (d,))[1]
                 for qq in points for d in (shift, probe)]
        _, pullback = jax.vjp(mech.g, q)
        _, g_lin = jax.linearize(mech.g, q)
        gram = lambda v: g_lin(jax.jvp(lambda pp: mech.dh_dp(q, pp), (p,), (pullback(v)[0],))[1])
        k = out["g"].shape[0]
        rhs = jnp.cos(0.3 + 1.7 * jnp.arange(k, dtype=p.dtype))
        _, ok, steps = pcg(gram, rhs, jnp.ones_like(rhs), rtol=_INDEPENDENCE_RTOL)
        out.update(mixed=jnp.max(jnp.abs(jnp.stack(mixed))), gram_solved=ok, gram_steps=steps)
    return out


#: The relative residual conjugate gradients must reach on G M⁻¹Gᵀ x = b for the start check
#: of a large system to call the constraints independent.
_INDEPENDENCE_RTOL = 1e-6


def check_holonomic_start(system: System, x0, *, need_separable: bool = False):
    """Raise a `ValueError` saying what is wrong if `x0` is not a valid start for RATTLE/SHAKE.

    Checks: H is quadratic in p (a mass-matrix kinetic energy); with `need_separable`,
    ∂²H/∂q∂p = 0 (a constant mass matrix); and G M⁻¹ Gᵀ is invertible (independent
    constraints): by its singular values up to `_DENSE_START_CHECK` coordinates, above by
    conjugate gradients on it (products only, nothing of size k × k). Whether x0 lies on S
    is checked by `geomjax.integrate` (`start_tol`).
    """
    x0 = as_state(x0, system.dim)
    dense = system.dim // 2 <= _DENSE_START_CHECK
    info = known_tree(_start_quantities(system, x0, dense))
    if info is None:  # values closed over from an enclosing trace: the run reports
        return
    g, gdot = info["g"], info["gdot"]
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(gdot))):
        raise ValueError("g(q0) or its velocity constraint is not finite at x0")
    if np.abs(info["linear_gap"]).max() > 1e-7 * float(info["linear_scale"]) + 1e-9:
        raise ValueError(
            "RATTLE/SHAKE here need a kinetic energy quadratic in p, H = ½pᵀM(q)⁻¹p + U(q): "
            "∂H/∂p is not linear in p at x0"
        )
    if need_separable and float(info["mixed"]) > 1e-10 * float(info["scale"]):
        raise ValueError(
            "H couples q and p (a position-dependent mass matrix): the explicit "
            "RATTLE/SHAKE kick–drift form is wrong for it; use geomjax.rattle(system, "
            "separable=False), the implicit generalised-leapfrog RATTLE"
        )
    # Independence of the constraints: G M⁻¹ Gᵀ must be invertible.
    if "gram" not in info:
        if not bool(info["gram_solved"]):
            raise ValueError(
                f"the constraints are not independent at q0: conjugate gradients on G M⁻¹ Gᵀ "
                f"({g.shape[0]} constraints) did not reach a relative residual of "
                f"{_INDEPENDENCE_RTOL:g} in {int(info['gram_steps'])} iterations, so the matrix is "
                "singular or nearly so and the multipliers are not determined (a repeated "
                "constraint, a closed loop of rods pulled straight, a pin on a pinned particle)"
            )
        return
    sv = np.linalg.svd(info["gram"], compute_uv=False)
    if not np.all(np.isfinite(sv)) or sv[-1] <= 1e-12 * max(sv[0], 1.0):
        raise ValueError(
            "the constraints are not independent at q0: G M⁻¹ Gᵀ is singular (singular values "
            f"{np.array2string(sv, precision=3)}), so the multipliers are not determined"
        )


def rattle(
    system: System,
    *,
    separable: bool = True,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
    structured: bool | str = True,
    refactor_every: int | None = None,
) -> Rattle:
    """The RATTLE method (Andersen 1983) for holonomic constraints, derived by autodiff.

    For H = ½pᵀM⁻¹p + U(q) and constraints g(q) = 0 (G = Dg), one step of size h is

    p½ = p − (h/2)(∇U(q) + G(q)ᵀλ),
    q₁ = q + h M⁻¹p½,                    g(q₁) = 0,
    p₁ = p½ − (h/2)(∇U(q₁) + G(q₁)ᵀμ),   G(q₁)M⁻¹p₁ = 0.

    λ ∈ Rᵏ comes from Newton's method (`geomjax.Newton`) on g(q₁(λ)) = 0, μ from one linear
    solve (the velocity constraint is affine in μ). The map is symplectic on
    S = {g = 0, G M⁻¹p = 0}, symmetric, of order 2, keeps g and G M⁻¹p at round-off and
    conserves energy to O(h²) without drift.

    With `separable=False` the mass matrix may depend on q and the step is the
    generalised leapfrog with constraints (Hairer–Lubich–Wanner VII.1.4):
    p½ = p − (h/2)(∂H/∂q(q, p½) + G(q)ᵀλ), q₁ = q + (h/2)(∂H/∂p(q, p½) + ∂H/∂p(q₁, p½)),
    g(q₁) = 0, p₁ = p½ − (h/2)(∂H/∂q(q₁, p½) + G(q₁)ᵀμ), G(q₁)∂H/∂p(q₁, p₁) = 0,
    with (p½, q₁, λ) from one Newton solve. Symplectic, symmetric, order 2.

    A Newton solve that does not converge (e.g. a step so large that g(q₁) = 0 has no
    solution) gives the step status `RESULTS.newton_failed`, which `geomjax.integrate` records in
    `Solution.status` and `Solution.failed_step`. Derivatives of the step with respect to
    the state and to parameters inside H and g follow the implicit function theorem.

    **Arguments:**

    - `system`: a `geomjax.System` built with `holonomic=g` (canonical structure).
    - `separable`: `True` (default) for a constant mass matrix, H = T(p) + U(q); `False`
      for a position-dependent one. `check(x0)` rejects a coupled H with `separable=True`.
    - `newton`: a `geomjax.Newton` with the solver settings for the multiplier (unknown
      ν = (h²/2)λ, a displacement). Default `Newton(iterations=2, then_loop=True)`: two
      iterations written out, then the result is checked (the error estimated from the
      last two updates with a safety factor, in the units of ν) against atol + rtol|ν|;
      if the check fails, a loop goes on (up to `max_steps` iterations), and a solve that
      still fails gives `RESULTS.newton_failed`.
    - `rtol`, `atol`, `max_iter`: the earlier keywords, still accepted: they set those
      fields of the default (`max_iter` asks for the loop with that many iterations at
      most). Not together with `newton`.
    - `structured`: `True` (default) to use the constraints' structure where it is found:
      the sparsity of the Newton matrix G(q₁)M⁻¹G(q)ᵀ and of the projection matrix
      G M⁻¹Gᵀ is read off the jaxpr of g and H at trace time, and when it is tridiagonal
      (a chain: each constraint couples neighbouring bodies) and k > 2 these matrices come
      from three Jacobian-vector products with coloured seeds and are solved in O(k)
      (`geomjax._solve.banded`). Any other sparse pattern with k ≥ 40 (a cloth, a tree, a
      ring, a molecule) is solved matrix-free: conjugate gradients on G M⁻¹Gᵀ with a
      Jacobi preconditioner, a chord iteration for λ (`geomjax._solve.krylov`), cost and
      memory O(nnz) per iteration, never a k × k matrix; a conjugate-gradient solve that
      does not converge gives `RESULTS.linear_solve_failed`. `"krylov"` asks for that
      path at any k where the pattern is sparse. `False` keeps the dense path (k forward
      products and a dense solve), e.g. for comparisons. The same equations and tests
      either way: the results agree to round-off.
    - `refactor_every`: for a large graph solved by blocks (the block Cholesky factors of
      G M⁻¹Gᵀ, e.g. a cloth), keep the factors from step to step and refactor every
      `refactor_every` steps (an integer ≥ 1) instead of every step: the chord iteration
      for λ then iterates with factors a few steps old (G M⁻¹Gᵀ changes by O(h) per
      step), and where it does not converge with them the step is redone with fresh ones,
      so the results are RATTLE's to the same tolerances, and derivatives stay exact.
      The loop carries the factors (memory ≈ 3 block rows of the band per constraint).
      Default `None`: factor at every step. Measured on a 100 × 100 cloth
      (`benchmarks/constraint_scaling.py --reuse`): see `docs/howto/large_systems.md`.

    **Returns:**

    A step (`geomjax.AbstractStep`): `step(x, h)` on flat states, usable with
    `geomjax.integrate`, `geomjax.StepSolver`, `jax.jit`, `jax.vmap` and `jax.grad`.
    `geomjax.integrate` calls `step.check(x0)`, which raises a `ValueError` if x0 is off S.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum(holonomic=True)
    sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=1e-3, steps=1000)
    ```
    """
    _require_holonomic(system, "rattle")
    newton = _rattle_newton(newton, rtol, atol, max_iter, separable)
    if refactor_every is not None and (isinstance(refactor_every, bool) or not isinstance(refactor_every, int)
                                       or refactor_every < 1):
        raise ValueError(f"rattle: refactor_every must be None or an integer >= 1, got {refactor_every!r}")
    return Rattle(system, bool(separable), True, newton, _as_structured(structured), refactor_every)


def shake(
    system: System,
    *,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
    structured: bool | str = True,
) -> Rattle:
    """The SHAKE method (Ryckaert, Ciccotti & Berendsen 1977) as a one-step map on (q, p).

    For H = ½pᵀM⁻¹p + U(q) (constant M) and constraints g(q) = 0:

    p½ = p − (h/2)(∇U(q) + G(q)ᵀλ),
    q₁ = q + h M⁻¹p½,                    g(q₁) = 0,
    p₁ = p½ − (h/2)(∇U(q₁) + G(q₁)ᵀλ).

    The positions are exactly those of the two-step SHAKE recursion
    q_{n+1} − 2q_n + q_{n−1} = −h²M⁻¹(∇U(q_n) + G(q_n)ᵀΛ_n) (the normal part of p is absorbed
    by the next multiplier), and p₁ differs from its central-difference momentum by O(h²).
    Unlike RATTLE, p is not projected: g(q) = 0 holds at round-off but the hidden
    constraint G M⁻¹p = 0 only to O(h²). Order 2.

    **Arguments:**

    - `system`: a `geomjax.System` with `holonomic=g` and a constant mass matrix.
    - `newton`, `rtol`, `atol`, `max_iter`: Newton settings for λ, as for `geomjax.rattle`.
    - `structured`: use the constraints' structure (a tridiagonal Newton matrix for a
      chain, matrix-free conjugate gradients for other sparse graphs), as for
      `geomjax.rattle`.

    **Returns:**

    A step usable with `geomjax.integrate`; Newton failures give status `RESULTS.newton_failed`.

    Example:

    ```python
    model = geomjax.models.planar_pendulum(holonomic=True)
    sol = geomjax.integrate(geomjax.shake(model.system), model.x0, dt=1e-2, steps=700)
    ```
    """
    _require_holonomic(system, "shake")
    return Rattle(system, True, False, _rattle_newton(newton, rtol, atol, max_iter), _as_structured(structured))


def _as_structured(structured):
    if isinstance(structured, str):
        if structured not in ("krylov", "banded"):
            raise ValueError(f"structured must be True, False, 'banded' or 'krylov', got {structured!r}")
        return structured
    return bool(structured)
