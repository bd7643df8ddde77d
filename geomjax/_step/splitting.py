"""Splitting and composition methods built from one-step maps.

If H = H₁ + H₂ and the flows φ¹_t, φ²_t of H₁ and H₂ are known exactly (or approximated
by a step), compositions of them approximate the flow of H:

- Lie–Trotter Φ_h = φ²_h ∘ φ¹_h, order 1;
- Strang Φ_h = φ¹_{h/2} ∘ φ²_h ∘ φ¹_{h/2}, order 2 and symmetric;
- a general composition Φ_h = φ^{(m)}_{c_m h} ∘ … ∘ φ^{(1)}_{c_1 h}, e.g. the triple jump
  (Yoshida 1990) raising a symmetric method of order 2k to order 2k + 2.

Compositions of symplectic maps are symplectic and compositions of maps that keep a set
invariant keep it invariant, so splitting a constrained system into sub-flows on the
constraint manifold (as for the spherical pendulum on T*S²) gives a method that stays on
it up to round-off.
"""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .._status import where_first
from .base import AbstractStep, FunctionStep, ok_status
from .rattle import RattleComposition


def _as_step(step) -> AbstractStep:
    if isinstance(step, AbstractStep):
        return step
    if callable(step):
        return FunctionStep(step)
    raise TypeError(f"expected a geomjax step or a callable step(x, h) ↦ x_next, got {type(step).__name__}")


def _same_layout(z, other):
    """True if the pieces `z` of one step can be handed to another step as they are."""
    a, b = jax.tree_util.tree_structure(z), jax.tree_util.tree_structure(other)
    if a != b:
        return False
    return all(u.shape == v.shape for u, v in zip(jax.tree_util.tree_leaves(z), jax.tree_util.tree_leaves(other)))


class Composition(AbstractStep):
    """Φ_h = φ^{(m)}_{c_m h} ∘ … ∘ φ^{(1)}_{c_1 h}, the i-th map being `steps[i % len(steps)]`.

    The state is carried in the pieces of `steps[0]`; a sub-step with a different layout
    (e.g. a plain function on flat states) receives and returns a flat state. The status is
    the first non-success status of the sub-steps.
    """

    steps: tuple
    coefficients: tuple = eqx.field(static=True)

    def split(self, x):
        return self.steps[0].split(x)

    def merge(self, z):
        return self.steps[0].merge(z)

    @property
    def dim(self):
        for s in self.steps:
            if s.dim is not None:
                return s.dim
        return None

    def check(self, x0) -> None:
        for s in self.steps:
            s.check(x0)

    def advance(self, t, z, h, args):
        head = self.steps[0]
        status = ok_status()
        # Each map keeps its own clock: the j-th map starts its sub-step at t plus the
        # time it has already advanced in this step.
        elapsed = [0.0] * len(self.steps)
        for i, c in enumerate(self.coefficients):
            j = i % len(self.steps)
            step = self.steps[j]
            t_sub = t + elapsed[j] * h
            elapsed[j] += c
            # Layouts are compared by tree structure and shapes (static at trace time);
            # an unused conversion is dropped by XLA.
            inner = z if step is head else step.split(head.merge(z))
            if step is head or _same_layout(z, inner):
                z, st = step.advance(t_sub, z, c * h, args)
            else:
                inner, st = step.advance(t_sub, inner, c * h, args)
                z = head.split(step.merge(inner))
            status = where_first(status, st)
        return z, status

    def at_start(self, z0):
        return eqx.tree_at(lambda s: s.steps, self, tuple(s.at_start(s.split(self.merge(z0))) for s in self.steps))

    def _unique_steps(self):
        seen = []
        for s in self.steps:
            if not any(s is u for u in seen):
                seen.append(s)
        return seen

    def constraint_residuals(self, x):
        """The residuals of every distinct sub-step, concatenated."""
        return jnp.concatenate([s.constraint_residuals(x) for s in self._unique_steps()])

    def invariants(self, x):
        """The invariants that every distinct sub-step claims, concatenated."""
        return jnp.concatenate([s.invariants(x) for s in self._unique_steps()])


def compose(steps: AbstractStep | Callable | Sequence, coefficients: Sequence[float]) -> AbstractStep:
    """A general composition method.

    Φ_h = φ^{(m)}_{c_m h} ∘ … ∘ φ^{(2)}_{c_2 h} ∘ φ^{(1)}_{c_1 h}: the maps are applied in the
    order of `coefficients`, the i-th one being `steps[i % len(steps)]` with step size
    cᵢh. So one step with coefficients (γ₁, γ₂, γ₃) is a composition method for that step,
    and two steps A, B with (a₁, b₁, a₂, b₂, …) are a splitting method alternating them.

    For a symmetric method Φ of order 2k the triple jump
    γ₁ = γ₃ = 1/(2 − 2^{1/(2k+1)}), γ₂ = −2^{1/(2k+1)}/(2 − 2^{1/(2k+1)}) gives order 2k + 2
    (`geomjax.triple_jump`). The coefficients of a consistent method sum to 1 for each map.

    **Arguments:**

    - `steps`: a step or a sequence of steps (geomjax steps, e.g. exact sub-flows, RATTLE,
      RK steps, or callables `step(x, h) ↦ x_next` on flat states).
    - `coefficients`: the fractions cᵢ of h, applied in order.

    **Returns:**

    A step usable with `geomjax.integrate`; its status is the first failing sub-step's.
    A composition of one separable RATTLE step (`geomjax.rattle(system)`) fuses the joints
    between its sub-steps: the velocity projection at a joint is left out and the force
    there evaluated once, since the next sub-step's position multiplier takes up the same
    direction G(q)ᵀ (the same map to round-off, one velocity solve and one force
    evaluation fewer per joint).

    Example (Yoshida's 4th-order method from Strang splitting):

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> kinetic, potential = geomjax.models.pendulum_flows(model)
    >>> s = geomjax.strang(kinetic, potential)
    >>> yoshida4 = geomjax.compose(s, geomjax.triple_jump_coefficients(2))
    >>> yoshida4(model.x0, 0.1).shape
    (6,)

    ```
    """
    if isinstance(steps, AbstractStep) or (callable(steps) and not isinstance(steps, Sequence)):
        steps = (steps,)
    steps = tuple(_as_step(s) for s in steps)
    if not steps:
        raise ValueError("compose needs at least one step")
    coefficients = tuple(float(c) for c in coefficients)
    if len(coefficients) < 1:
        raise ValueError("compose needs at least one coefficient")
    for j in range(len(steps)):
        total = sum(coefficients[j :: len(steps)])
        if abs(total - 1.0) > 1e-12:
            raise ValueError(
                f"the coefficients of steps[{j}] sum to {total:.15g}, not 1: the composition would "
                "not be consistent (each map must advance a full step h in total)"
            )
    if len(steps) == 1 and RattleComposition.fuses(steps[0]):
        # one separable RATTLE step: the joints between its sub-steps fused (the same map)
        return RattleComposition(steps[0], coefficients)
    return Composition(steps, coefficients)


def lie_trotter(flow_a, flow_b) -> Composition:
    """Lie–Trotter splitting Φ_h = φᴮ_h ∘ φᴬ_h: first `flow_a` for h, then `flow_b` for h.

    If `flow_a`, `flow_b` are the exact flows of H_A and H_B, Φ_h is a first-order method for
    H = H_A + H_B (symplectic when both are). Its adjoint is `lie_trotter(flow_b, flow_a)`.

    **Arguments:**

    - `flow_a`, `flow_b`: steps (exact sub-flows or approximations) on the same state.

    **Returns:**

    A `Composition` step.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> kinetic, potential = geomjax.models.pendulum_flows(model)
    >>> sol = geomjax.integrate(geomjax.lie_trotter(kinetic, potential), model.x0, dt=1e-3, steps=1000)
    >>> sol.message
    'success'

    ```
    """
    return compose((flow_a, flow_b), (1.0, 1.0))


def strang(flow_a, flow_b) -> Composition:
    """Strang splitting Φ_h = φᴬ_{h/2} ∘ φᴮ_h ∘ φᴬ_{h/2}: symmetric, order 2.

    **Arguments:**

    - `flow_a`: the map taken in two half steps; `flow_b`: the map taken in one full step.

    **Returns:**

    A `Composition` step.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> kinetic, potential = geomjax.models.pendulum_flows(model)
    >>> step = geomjax.strang(potential, kinetic)   # kick–drift–kick (velocity Verlet) order
    >>> step(model.x0, 0.01).shape
    (6,)

    ```
    """
    return compose((flow_a, flow_b), (0.5, 1.0, 0.5))


def triple_jump_coefficients(order: int) -> tuple[float, float, float]:
    """(γ₁, γ₂, γ₃) of the triple jump that lifts a symmetric method of even `order` p to p + 2.

    γ₁ = γ₃ = 1/(2 − 2^{1/(p+1)}), γ₂ = 1 − 2γ₁ (Creutz–Gocksch 1989, Yoshida 1990).

    Example:

    ```python
    >>> import geomjax
    >>> [round(c, 4) for c in geomjax.triple_jump_coefficients(2)]
    [1.3512, -1.7024, 1.3512]

    ```
    """
    if order < 2 or order % 2:
        raise ValueError(f"the triple jump needs a symmetric method of even order ≥ 2, got {order}")
    root = 2.0 ** (1.0 / (order + 1))
    g1 = 1.0 / (2.0 - root)
    return (g1, 1.0 - 2.0 * g1, g1)


def triple_jump(step, order: int = 2) -> AbstractStep:
    """The triple-jump composition Φ_{γ₁h} ∘ Φ_{γ₂h} ∘ Φ_{γ₁h} of a symmetric step of `order`.

    Gives a symmetric method of order `order + 2` (e.g. Strang or RATTLE → order 4).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> rattle4 = geomjax.triple_jump(geomjax.rattle(model.system))  # 4th order, symplectic
    >>> geomjax.integrate(rattle4, model.x0, dt=0.01, steps=100).message
    'success'

    ```
    """
    return compose(step, triple_jump_coefficients(order))
