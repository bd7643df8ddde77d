"""Discrete Lagrangians L_d from a Lagrangian L and a discretizing map Ψ: Q × Q → TQ.

A quadrature rule places nodes on the segment from q₀ to q₁ over one step of size h:
node i has weight wᵢ, position qᵢ = q₀ + cᵢ(q₁ − q₀), velocity v = (q₁ − q₀)/h, time
tᵢ = t₀ + cᵢh and, for a contact Lagrangian L(q, v, z), action zᵢ = z₀ + dᵢ(z₁ − z₀). Then

    L_d(q₀, q₁, z₀, z₁) = h Σᵢ wᵢ L(qᵢ, v, zᵢ)     (≈ ∫ L dt over the step).

Built-in rules (`RULES`):

| name | nodes (w, c, d) | L_d |
|---|---|---|
| `"left"` | (1, 0, 0) | h L(q₀, v, z₀) |
| `"right"` | (1, 1, 1) | h L(q₁, v, z₁) |
| `"midpoint"` | (1, ½, ½) | h L((q₀+q₁)/2, v, (z₀+z₁)/2) |
| `"trapezoidal"` | (½, 0, 0), (½, 1, 1) | h/2 [L(q₀, v, z₀) + L(q₁, v, z₁)] |
| `"trapezoidal_left_z"` | (½, 0, 0), (½, 1, 0) | h/2 [L(q₀, v, z₀) + L(q₁, v, z₀)] |

A user's discretizing map is a callable `psi(q0, q1, h) ↦ (q, v)`: one node of weight 1
(L_d = h L∘Ψ, the paper's L_d = L∘Ψ up to the factor h), with the action and time taken at
the left end (z₀, t₀).

The derivatives D₁…D₄ of L_d in (q₀, q₁, z₀, z₁) come from autodiff. The discrete forces
follow from the same rule as the virtual work of F along the node positions:
F_d^−·δq₀ + F_d^+·δq₁ = h Σᵢ wᵢ F(qᵢ, v, tᵢ)·δqᵢ, i.e. F_d^± = h Σᵢ wᵢ (∂qᵢ/∂q_{0,1})ᵀ F
(for linear nodes F_d^− = h Σ wᵢ(1 − cᵢ)Fᵢ, F_d^+ = h Σ wᵢcᵢFᵢ; for `"left"` this is
Maciel, Ortiz and Schaerer (2020) eq. (6)). Discrete constraints are Φ_d(q₀, q₁) = Σᵢ wᵢ Φ(qᵢ, v) (Φ∘Ψ for a
one-node rule).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

#: name -> nodes (weight, position fraction c, action fraction d)
RULES: dict[str, tuple[tuple[float, float, float], ...]] = {
    "left": ((1.0, 0.0, 0.0),),
    "right": ((1.0, 1.0, 1.0),),
    "midpoint": ((1.0, 0.5, 0.5),),
    "trapezoidal": ((0.5, 0.0, 0.0), (0.5, 1.0, 1.0)),
    "trapezoidal_left_z": ((0.5, 0.0, 0.0), (0.5, 1.0, 0.0)),
}


class Rule(eqx.Module):
    """A discretizing map Ψ: a named quadrature rule or a user callable `psi(q0, q1, h)`."""

    name: str = eqx.field(static=True)
    nodes: tuple = eqx.field(static=True)
    psi: Callable | None = None

    @property
    def implicit_z(self) -> bool:
        """True when L_d depends on the new action z₁ (then z₁ is an unknown of the step)."""
        return self.psi is None and any(d != 0.0 for _, _, d in self.nodes)

    def points(self, q0, q1, z0, z1, t0, h):
        """[(weight, q, v, z, t)] at the rule's nodes."""
        if self.psi is not None:
            q, v = self.psi(q0, q1, h)
            return [(1.0, q, v, z0, t0)]
        v = (q1 - q0) / h
        out = []
        for w, c, d in self.nodes:
            q = q0 if c == 0.0 else (q1 if c == 1.0 else q0 + c * (q1 - q0))
            z = z0 if d == 0.0 else (z1 if d == 1.0 else z0 + d * (z1 - z0))
            out.append((w, q, v, z, t0 + c * h))
        return out


def as_rule(rule) -> Rule:
    """A `Rule` from a name in `RULES`, a `Rule`, or a callable `psi(q0, q1, h) ↦ (q, v)`."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str):
        if rule not in RULES:
            raise ValueError(f"unknown discretization rule {rule!r}; choose one of {sorted(RULES)} or pass psi(q0, q1, h) ↦ (q, v)")
        return Rule(rule, RULES[rule])
    if callable(rule):
        return Rule("user", ((1.0, 0.0, 0.0),), rule)
    raise TypeError(f"rule must be a name in {sorted(RULES)} or a callable psi(q0, q1, h) ↦ (q, v), got {type(rule).__name__}")


class DiscreteLagrangian(eqx.Module):
    """L_d(q₀, q₁, z₀, z₁; h) = h Σᵢ wᵢ L(qᵢ, v, zᵢ) for a rule Ψ; built by `geomjax.discrete_lagrangian`.

    For a Lagrangian without action (`contact=False`) the z arguments are ignored and the
    z-derivatives vanish.
    """

    lagrangian: Callable
    rule: Rule
    contact: bool = eqx.field(static=True)

    def lagrangian_qvz(self, q, v, z):
        """L(q, v, z) (ignoring z for a Lagrangian without action)."""
        return self.lagrangian(q, v, z) if self.contact else self.lagrangian(q, v)

    def __call__(self, q0, q1, h, z0=0.0, z1=0.0):
        """L_d(q₀, q₁, z₀, z₁) for a step of size h."""
        total = 0.0
        for w, q, v, z, _ in self.rule.points(q0, q1, z0, z1, 0.0, h):
            total = total + w * self.lagrangian_qvz(q, v, z)
        return h * total

    def derivatives(self, q0, q1, h, z0=0.0, z1=0.0):
        """(D₁L_d, D₂L_d, D₃L_d, D₄L_d): the partial derivatives in q₀, q₁, z₀, z₁."""
        z0 = jnp.asarray(z0, q0.dtype)
        z1 = jnp.asarray(z1, q0.dtype)
        return jax.grad(lambda a, b, c, d: self(a, b, h, c, d), argnums=(0, 1, 2, 3))(q0, q1, z0, z1)

    def momenta(self, q0, q1, h, z0=0.0, z1=0.0):
        """The discrete Legendre transforms (position–momentum form): (p₀, p₁) with

        p₀ = −D₁L_d / (1 + D₃L_d),   p₁ = D₂L_d / (1 − D₄L_d)

        (Vermeeren–Bravetti–Seri; for a Lagrangian without action p₀ = −D₁L_d, p₁ = D₂L_d).
        """
        d1, d2, d3, d4 = self.derivatives(q0, q1, h, z0, z1)
        return -d1 / (1.0 + d3), d2 / (1.0 - d4)

    def forces(self, force, q0, q1, h, t0=0.0):
        """(F_d^−, F_d^+) of the force `force(q, v, t)` by this rule (virtual work along the nodes)."""
        t0 = jnp.asarray(t0, q0.dtype)

        def work_points(a, b):
            return [(w, q) for w, q, _, _, _ in self.rule.points(a, b, 0.0, 0.0, t0, h)]

        values = [
            (w, force(q, v, t)) for w, q, v, _, t in self.rule.points(q0, q1, 0.0, 0.0, t0, h)
        ]

        def virtual_work(a, b):
            return sum(w * jnp.vdot(f, q) for (w, q), (_, f) in zip(work_points(a, b), values))

        fm, fp = jax.grad(virtual_work, argnums=(0, 1))(q0, q1)
        return h * fm, h * fp

    def constraint(self, phi, q0, q1, h):
        """Φ_d(q₀, q₁) = Σᵢ wᵢ Φ(qᵢ, v) (Φ∘Ψ for a one-node rule)."""
        total = 0.0
        for w, q, v, _, _ in self.rule.points(q0, q1, 0.0, 0.0, 0.0, h):
            total = total + w * phi(q, v)
        return total


def discrete_lagrangian(lagrangian: Callable, rule="midpoint", *, contact: bool = False) -> DiscreteLagrangian:
    """The discrete Lagrangian L_d ≈ ∫ L dt over one step, from L and a discretizing map Ψ.

    L_d(q₀, q₁, z₀, z₁; h) = h Σᵢ wᵢ L(qᵢ, (q₁ − q₀)/h, zᵢ) with the nodes of `rule`:

    - `"left"`: h L(q₀, v, z₀); `"right"`: h L(q₁, v, z₁);
    - `"midpoint"`: h L((q₀+q₁)/2, v, (z₀+z₁)/2);
    - `"trapezoidal"`: h/2 [L(q₀, v, z₀) + L(q₁, v, z₁)];
    - `"trapezoidal_left_z"`: h/2 [L(q₀, v, z₀) + L(q₁, v, z₀)] (the first-order contact
      integrator of Vermeeren–Bravetti–Seri);
    - a callable `psi(q0, q1, h) ↦ (q, v)`: h L(Ψ(q₀, q₁), z₀).

    Its partial derivatives D₁…D₄ (`derivatives`), the discrete Legendre transforms
    p₀ = −D₁L_d/(1 + D₃L_d), p₁ = D₂L_d/(1 − D₄L_d) (`momenta`), discrete forces F_d^±
    (`forces`) and discrete constraints Φ_d = Σ wᵢ Φ(qᵢ, v) (`constraint`) are by autodiff.

    **Arguments:**

    - `lagrangian`: `L(q, v)`, or `L(q, v, z)` with `contact=True`.
    - `rule`: a name above or a callable Ψ.
    - `contact`: whether L takes the action z.

    Example (midpoint rule for the harmonic oscillator; p₁ = D₂L_d):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> Ld = geomjax.discrete_lagrangian(lambda q, v: 0.5 * v @ v - 0.5 * q @ q, "midpoint")
    >>> q0, q1, h = jnp.array([1.0]), jnp.array([0.9]), 0.1
    >>> p0, p1 = Ld.momenta(q0, q1, h)
    >>> print(f"{float(p1[0]):.6f}")   # (q₁ − q₀)/h − h (q₀ + q₁)/4
    -1.047500

    ```
    """
    if not callable(lagrangian):
        raise TypeError(f"lagrangian must be a callable, got {type(lagrangian).__name__}")
    return DiscreteLagrangian(lagrangian, as_rule(rule), bool(contact))
