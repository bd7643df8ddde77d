"""Constrained Hamiltonian networks and a neural-ODE baseline, as equinox modules.

A constrained Hamiltonian network (Finzi, Wang and Wilson (2020)) learns the Hamiltonian
of a mechanical system written in Cartesian coordinates, and is told its holonomic
constraints g(q) = 0 instead of having to learn them. Here the learned H is handed to
geomjax as a `HolonomicSystem`: its Dirac field, RATTLE and feedback field are derived
from it by autodiff like those of any other system, so a rollout of the network is a
rollout of geomjax on that system.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._system.structures import canonical
from .._system.system import HolonomicSystem

#: Floor added to the softplus of the mass factor's diagonal: L_ii ≥ this, so M = LLᵀ
#: stays positive definite in floating point whatever the raw parameters.
DIAGONAL_FLOOR = 1e-4

_HAMILTONIANS = ("separable", "mlp")
_OBSERVED = ("velocity", "momentum")


def _inverse_softplus(y: float) -> float:
    return float(np.log(np.expm1(y)))


def parameter_count(model) -> int:
    """The number of trainable scalars of a model: the floating-point array entries that
    `geomjax.train` updates (for a `ConstrainedHamiltonianNetwork`, the mass factor and
    the networks; the constraint function's own parameters are not trained).

    Example:

    ```python
    >>> import jax, geomjax
    >>> node = geomjax.NeuralODE(4, width_size=8, depth=2, key=jax.random.key(0))
    >>> geomjax.parameter_count(node)  # (4·8 + 8) + (8·8 + 8) + (8·4 + 4)
    148

    ```
    """
    params = eqx.filter(model, trainable_filter(model))
    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params)))


def _is_parameter(leaf) -> bool:
    """An inexact array, or its shape (a model built by `equinox.filter_eval_shape`)."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return bool(jnp.issubdtype(leaf.dtype, jnp.inexact))
    return eqx.is_inexact_array(leaf)


def trainable_filter(model):
    """The filter spec (a pytree of bools shaped like `model`) of the leaves training
    updates: inexact arrays, except those of a `ConstrainedHamiltonianNetwork`'s
    `constraints` (the known constraint function's parameters, e.g. link lengths)."""
    spec = jax.tree_util.tree_map(_is_parameter, model)
    if isinstance(model, ConstrainedHamiltonianNetwork):
        frozen = jax.tree_util.tree_map(lambda _: False, model.constraints)
        spec = eqx.tree_at(lambda m: m.constraints, spec, frozen, is_leaf=lambda x: x is None)
    return spec


class _SeparableHamiltonian(eqx.Module):
    """H(q, p) = ½|L⁻¹p|² + V(q) = ½pᵀM⁻¹p + V(q) with M = LLᵀ, on the flat state (q, p)."""

    inverse_factor: Array  # L⁻¹, lower triangular, (b, b)
    potential: eqx.nn.MLP
    space_dim: int = eqx.field(static=True)

    def __call__(self, x):
        n = x.shape[0] // 2
        q, p = x[:n], x[n:]
        y = self.inverse_factor @ p.reshape(-1, self.space_dim)
        return 0.5 * jnp.sum(y * y) + self.potential(q)


class _GeneralHamiltonian(eqx.Module):
    """H(q, p) = ½|L⁻¹p|² + N(q, p): a learned mass term plus an MLP of the whole state."""

    inverse_factor: Array
    network: eqx.nn.MLP
    space_dim: int = eqx.field(static=True)

    def __call__(self, x):
        n = x.shape[0] // 2
        p = x[n:]
        y = self.inverse_factor @ p.reshape(-1, self.space_dim)
        return 0.5 * jnp.sum(y * y) + self.network(x)


class ConstrainedHamiltonianNetwork(eqx.Module):
    """A Hamiltonian network on T*Rⁿ with known holonomic constraints g(q) = 0.

    The configuration q ∈ Rⁿ is Cartesian: `n // space_dim` points in R^`space_dim`
    (for a planar chain of N links, N points in R², n = 2N). The learned Hamiltonian is

    H_θ(q, p) = ½ pᵀM⁻¹p + V_θ(q),    M = (LLᵀ) ⊗ I_d,

    with L a lower-triangular b × b matrix (b = n/d bodies, d = `space_dim`) whose
    diagonal is softplus(raw) + 10⁻⁴ > 0, so M is symmetric positive definite for any
    parameters (the kinetic energy of point masses in Rᵈ mixes bodies, never spatial
    directions, when d > 1), initialised at L = I; and V_θ an MLP Rⁿ → R
    (`equinox.nn.MLP`, smooth activation). With `hamiltonian="mlp"` the potential is
    replaced by an MLP N_θ(q, p) of the whole state: H_θ = ½pᵀM⁻¹p + N_θ(q, p), a
    general learned H whose kinetic term keeps ∂²H/∂p² invertible at the start of
    training.

    `system()` is a geomjax `HolonomicSystem` for H_θ and g: geomjax adds the hidden
    constraint Dg(q)·∂H/∂p = 0 and derives the Dirac field
    X = X_H − Σ (C⁻¹)_ij {H, f_i} X_{f_j} (the constrained dynamics with Lagrange
    multipliers, `geomjax.dirac_field`), RATTLE (`geomjax.rattle`, for the separable H
    only: it needs H = ½pᵀM⁻¹p + V(q)) and feedback fields from it.

    Data are observed as x = (q, v) with v = q̇ (`observed="velocity"`, the default):
    the network maps them to canonical states with p = Mv (`to_canonical`) and back with
    v = M⁻¹p (`from_canonical`); because v is observed, the hidden constraint
    Dg(q)·v = 0 holds at every observed start whatever M is. With `observed="momentum"`
    the data are canonical (q, p) already (necessary for `hamiltonian="mlp"`, whose
    velocity ∂H/∂p is not linear in p).

    `geomjax.rollout`, `train`, `rollout_error` and `network_gains` run the network's
    fields with geomjax's scalar-graph simplification off. Where you pass `system()` to
    geomjax yourself, the pass leaves a network unsimplified once its traced weights and
    the state exceed `geomjax.internal.simplify.MAX_INPUTS` scalars; a smaller network is
    expanded (slower to compile: a width-4 network's training 16.4 s against 5.4 s), which
    building the field or step with `simplify=False` avoids (or
    `geomjax.internal.simplify.unsimplified(field)`).

    **Arguments:**

    - `n`: the number of configuration coordinates (the state has 2n entries).
    - `constraints`: `q ↦ g(q)`, the known holonomic constraints, shape `(k,)` (e.g.
      `geomjax.models.planar_chain(2).system.holonomic`). Its parameters are not trained.
    - `space_dim`: d, the dimension of the space the points live in (n must be a
      multiple); 1 gives a full n × n mass matrix.
    - `width_size`, `depth`, `activation`: the MLP (defaults: three hidden layers of 256
      tanh units, the size Finzi, Wang and Wilson (2020) use).
    - `hamiltonian`: `"separable"` (½pᵀM⁻¹p + V_θ(q)) or `"mlp"` (½pᵀM⁻¹p + N_θ(q, p)).
    - `observed`: `"velocity"` or `"momentum"`, what the second half of a data state is.
    - `key`: a `jax.random` key for the MLP's initial weights.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp, geomjax
    >>> pendulum = geomjax.models.planar_pendulum(holonomic=True)
    >>> net = geomjax.ConstrainedHamiltonianNetwork(
    ...     2, pendulum.system.holonomic, width_size=8, depth=1, key=jax.random.key(0))
    >>> net.mass_matrix().tolist()  # L = I at initialisation
    [[1.0, 0.0], [0.0, 1.0]]
    >>> system = net.system()
    >>> isinstance(system, geomjax.HolonomicSystem), geomjax.parameter_count(net)  # L: 3, MLP: 33
    (True, 36)
    >>> X = geomjax.dirac_field(system)  # the constrained dynamics of the learned H
    >>> X(net.to_canonical(pendulum.x0)).shape
    (4,)

    ```
    """

    mass_factor: Float[Array, " m"]
    network: eqx.nn.MLP
    constraints: Callable
    n: int = eqx.field(static=True)
    space_dim: int = eqx.field(static=True)
    hamiltonian_kind: str = eqx.field(static=True)
    observed: str = eqx.field(static=True)

    def __init__(
        self,
        n: int,
        constraints: Callable,
        *,
        space_dim: int = 1,
        width_size: int = 256,
        depth: int = 3,
        activation: Callable = jnp.tanh,
        hamiltonian: str = "separable",
        observed: str = "velocity",
        key: PRNGKeyArray,
    ):
        n, space_dim = int(n), int(space_dim)
        if n < 1 or space_dim < 1 or n % space_dim:
            raise ValueError(f"n must be a positive multiple of space_dim, got n={n}, space_dim={space_dim}")
        if not callable(constraints):
            raise TypeError(f"constraints must be a callable q ↦ g(q), got {type(constraints).__name__}")
        if hamiltonian not in _HAMILTONIANS:
            raise ValueError(f"hamiltonian must be one of {_HAMILTONIANS}, got {hamiltonian!r}")
        if observed not in _OBSERVED:
            raise ValueError(f"observed must be one of {_OBSERVED}, got {observed!r}")
        if hamiltonian == "mlp" and observed == "velocity":
            raise ValueError(
                "hamiltonian='mlp' needs observed='momentum': its velocity ∂H/∂p is a nonlinear function "
                "of p, so observed velocities do not determine the momenta; give canonical data (q, p)"
            )
        _check_constraints(constraints, n)
        b = n // space_dim
        diagonal = jnp.full((b,), _inverse_softplus(1.0 - DIAGONAL_FLOOR))
        self.mass_factor = jnp.zeros((b * (b + 1) // 2,)).at[_diagonal_positions(b)].set(diagonal)
        in_size = n if hamiltonian == "separable" else 2 * n
        self.network = eqx.nn.MLP(in_size, "scalar", width_size, depth, activation=activation, key=key)
        self.constraints = constraints
        self.n = n
        self.space_dim = space_dim
        self.hamiltonian_kind = hamiltonian
        self.observed = observed

    @property
    def bodies(self) -> int:
        """b = n / space_dim, the size of the learned factor L."""
        return self.n // self.space_dim

    def factor(self) -> Float[Array, "b b"]:
        """L: lower triangular, diagonal softplus(raw) + 10⁻⁴, so that M = (LLᵀ) ⊗ I_d."""
        b = self.bodies
        rows, cols = np.tril_indices(b)
        raw = jnp.zeros((b, b), self.mass_factor.dtype).at[rows, cols].set(self.mass_factor)
        diagonal = jax.nn.softplus(jnp.diagonal(raw)) + DIAGONAL_FLOOR
        return jnp.tril(raw, -1) + jnp.diag(diagonal)

    def mass_matrix(self) -> Float[Array, "n n"]:
        """M = (LLᵀ) ⊗ I_d, the learned constant mass matrix (n × n, symmetric positive definite)."""
        lower = self.factor()
        return jnp.kron(lower @ lower.T, jnp.eye(self.space_dim, dtype=lower.dtype))

    def _hamiltonian_module(self):
        # L⁻¹ is computed here, once, not inside every evaluation of H in a loop.
        lower = self.factor()
        inverse = jax.scipy.linalg.solve_triangular(lower, jnp.eye(lower.shape[0], dtype=lower.dtype), lower=True)
        if self.hamiltonian_kind == "separable":
            return _SeparableHamiltonian(inverse, self.network, self.space_dim)
        return _GeneralHamiltonian(inverse, self.network, self.space_dim)

    def hamiltonian(self, x: Float[Array, " 2n"]) -> Float[Array, ""]:
        """H_θ(x) at the flat canonical state x = (q, p)."""
        return self._hamiltonian_module()(x)

    def potential(self, q: Float[Array, " n"]) -> Float[Array, ""]:
        """V_θ(q), the learned potential (separable networks only)."""
        if self.hamiltonian_kind != "separable":
            raise ValueError("a network with hamiltonian='mlp' has no separate potential: use hamiltonian(x)")
        return self.network(q)

    def system(self) -> HolonomicSystem:
        """The geomjax `HolonomicSystem` of H_θ and the constraints g (canonical structure
        on R²ⁿ). Build it where it is used (inside the loss, under `jit`): the factor L⁻¹
        is computed when it is built."""
        return HolonomicSystem(self._hamiltonian_module(), canonical(self.n), holonomic=self.constraints)

    def to_canonical(self, x: Float[Array, " 2n"]) -> Float[Array, " 2n"]:
        """An observed state (q, v) → the canonical (q, p), p = Mv (identity for observed momenta)."""
        if self.observed == "momentum":
            return x
        lower = self.factor()
        q, v = x[: self.n], x[self.n :].reshape(-1, self.space_dim)
        return jnp.concatenate([q, (lower @ (lower.T @ v)).reshape(-1)])

    def from_canonical(self, x: Float[Array, " 2n"]) -> Float[Array, " 2n"]:
        """A canonical state (q, p) → the observed (q, v), v = M⁻¹p (identity for observed momenta)."""
        if self.observed == "momentum":
            return x
        inverse = self._hamiltonian_module().inverse_factor
        q, p = x[: self.n], x[self.n :].reshape(-1, self.space_dim)
        return jnp.concatenate([q, (inverse.T @ (inverse @ p)).reshape(-1)])

    def canonical_maps(self):
        """`(to_canonical, from_canonical)` with L and L⁻¹ computed once, for use on many states."""
        if self.observed == "momentum":
            return (lambda x: x), (lambda x: x)
        lower = self.factor()
        inverse = self._hamiltonian_module().inverse_factor
        n, d = self.n, self.space_dim

        def to_canonical(x):
            v = x[n:].reshape(-1, d)
            return jnp.concatenate([x[:n], (lower @ (lower.T @ v)).reshape(-1)])

        def from_canonical(x):
            p = x[n:].reshape(-1, d)
            return jnp.concatenate([x[:n], (inverse.T @ (inverse @ p)).reshape(-1)])

        return to_canonical, from_canonical


def _check_constraints(constraints, n: int) -> None:
    """g must map q ∈ Rⁿ to a vector (k,) of real values (traced on an abstract q)."""
    try:
        out = jax.eval_shape(lambda q: jnp.atleast_1d(constraints(q)), jax.ShapeDtypeStruct((n,), jnp.float64))
    except Exception as err:  # noqa: BLE001 (the user's function: any error, reported with its cause)
        raise TypeError(f"constraints(q) failed on a configuration of {n} coordinates: {err}") from err
    if out.ndim != 1 or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"constraints(q) must return a real vector g(q) of shape (k,), got {out.dtype}{out.shape}")


def _diagonal_positions(b: int) -> np.ndarray:
    """Indices of the diagonal entries in the row-major packed lower triangle of a b × b matrix."""
    rows, cols = np.tril_indices(b)
    return np.flatnonzero(rows == cols)


class NeuralODE(eqx.Module):
    """A neural ODE ẋ = f_θ(x) on the observed state: the unconstrained baseline.

    f_θ is an `equinox.nn.MLP` R^dim → R^dim. It knows nothing of energy or constraints;
    `NeuralODE.sized_like(network, key=...)` makes one with about as many parameters as
    a given network (within ±10 %), the comparison Finzi, Wang and Wilson (2020) make.
    With `order=2` it is a second-order neural ODE on a state x = (q, q̇) of positions and
    velocities: ẋ = (q̇, a_θ(q, q̇)), the MLP a_θ: R^dim → R^(dim/2) learning only the
    accelerations (the kinematics q̇ = dq/dt is built in, as in a Lagrangian model).

    **Arguments:**

    - `dim`: the length of the state.
    - `width_size`, `depth`, `activation`: the MLP.
    - `order`: 1 (ẋ = f_θ(x)) or 2 (ẋ = (q̇, a_θ(x)), `dim` even).
    - `key`: a `jax.random` key.

    Example:

    ```python
    >>> import jax, geomjax
    >>> node = geomjax.NeuralODE(4, width_size=8, depth=2, key=jax.random.key(0))
    >>> node(jax.numpy.ones(4)).shape
    (4,)
    >>> second = geomjax.NeuralODE(4, width_size=8, depth=2, order=2, key=jax.random.key(0))
    >>> second(jax.numpy.array([0.0, 0.0, 1.0, 2.0]))[:2].tolist()  # q̇ as given
    [1.0, 2.0]

    ```
    """

    network: eqx.nn.MLP
    dim: int = eqx.field(static=True)
    order: int = eqx.field(static=True, default=1)

    def __init__(
        self,
        dim: int,
        *,
        width_size: int = 256,
        depth: int = 3,
        activation: Callable = jnp.tanh,
        order: int = 1,
        key: PRNGKeyArray,
    ):
        self.dim = int(dim)
        if order not in (1, 2):
            raise ValueError(f"order must be 1 (ẋ = f(x)) or 2 (ẋ = (q̇, a(q, q̇))), got {order!r}")
        if order == 2 and self.dim % 2:
            raise ValueError(f"a second-order neural ODE needs a state (q, q̇) of even length, got dim = {self.dim}")
        self.order = int(order)
        out = self.dim if order == 1 else self.dim // 2
        self.network = eqx.nn.MLP(self.dim, out, width_size, depth, activation=activation, key=key)

    def __call__(self, x: Float[Array, " dim"]) -> Float[Array, " dim"]:
        """f_θ(x), the learned ẋ (with `order=2`, (q̇, a_θ(x)))."""
        if self.order == 1:
            return self.network(x)
        return jnp.concatenate([x[self.dim // 2 :], self.network(x)])

    @staticmethod
    def width_for(parameters: int, dim: int, depth: int, out: int | None = None) -> int:
        """The MLP width whose parameter count is closest to `parameters`: the count of
        dim → w → … → w → out (out = dim unless given) with `depth` hidden layers is
        (depth − 1)w² + (dim + out + depth)w + out."""
        out = dim if out is None else int(out)
        a, b, c = depth - 1, dim + out + depth, out - parameters
        if a == 0:
            width = -c / b
        else:
            width = (-b + np.sqrt(b * b - 4 * a * c)) / (2 * a)
        candidates = [max(1, int(np.floor(width))), max(1, int(np.ceil(width)))]
        return min(candidates, key=lambda w: abs(a * w * w + b * w + out - parameters))

    @classmethod
    def sized_like(cls, model, *, depth: int | None = None, activation: Callable = jnp.tanh, order: int = 1,
                   key: PRNGKeyArray):
        """A `NeuralODE` (of `order` 1 or 2) on the observed state of `model` (a
        `ConstrainedHamiltonianNetwork`) with about its number of trainable parameters: the
        same depth (unless given), the width chosen by `width_for`. A ValueError if no width
        comes within ±10 %."""
        if not isinstance(model, ConstrainedHamiltonianNetwork):
            raise TypeError(
                f"NeuralODE.sized_like takes a ConstrainedHamiltonianNetwork (the model to match), got "
                f"{type(model).__name__}"
            )
        dim = 2 * model.n
        depth = len(model.network.layers) - 1 if depth is None else int(depth)
        target = parameter_count(model)
        width = cls.width_for(target, dim, depth, dim if order == 1 else dim // 2)
        node = cls(dim, width_size=width, depth=depth, activation=activation, order=order, key=key)
        count = parameter_count(node)
        if abs(count - target) > 0.1 * target:
            raise ValueError(
                f"no MLP of depth {depth} on {dim} inputs has within 10 % of {target} parameters "
                f"(width {width} gives {count}); choose another depth"
            )
        return node
