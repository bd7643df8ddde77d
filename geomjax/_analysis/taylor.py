"""Order conditions of parametrised one-step methods, found by Taylor expansion in h.

The procedure of Hamdouni and Salnikov (2021), automated. A family of one-step
methods Φ_h(x; θ) has coefficients θ = (θ₁, …, θ_k) (for example a, b, c, d). A *defect*
d(θ, problem, h) measures how far one step is from having a property: the symplecticity
defect DΦ_hᵀ J DΦ_h − J, the algebraic relations p = ∂L/∂v and α(q)·v = 0 at the end of a
Dirac step, or the local error Φ_h(x) − φ_h(x) against the exact flow. Write

    d(θ, problem, h) = Σ_m d_m(θ, problem) hᵐ.

The method has the property to order m for *every* problem of a class (arbitrary H, L,
φ, states) when d_1 = … = d_m = 0 for all problems. Three pieces:

1. `taylor_coefficients`: d_m at h = 0 by nested forward-mode derivatives in h. Implicit
   maps solved inside by `geomjax.Newton` differentiate through the implicit function
   theorem (`lax.custom_root`), which stays exact at every order.
2. `order_conditions`: d_m(θ, P) is a polynomial in θ (the implicit solves are trivial at
   h = 0) whose coefficients depend on the problem P. Evaluated at random problems
   P₁…P_S and random θ, it is fitted over the monomials of θ, giving polynomials
   g_{m,s}(θ) = d_m(θ, P_s)[component]. "d_m vanishes for all problems" is "every
   polynomial in their linear span vanishes"; the span is returned in reduced row echelon
   form over a graded order of the monomials, with coefficients rounded to small
   rationals — one `OrderCondition` per basis polynomial.
3. `solve_conditions`: a point θ where given conditions hold (Newton with minimum-norm
   steps), with some coefficients fixed by choice; `reduce_conditions` (with sympy) states
   the conditions of several powers as one reduced Gröbner basis.

The fit needs the defect to be polynomial in θ. When it is rational with denominators
that are powers of some coefficients (an implicit stage solved with a factor â in front
of the multipliers, say), name them in `nonzero=`: d_m is multiplied by the smallest
power of their product that makes it polynomial, and each condition is divided by the
largest monomial in those coefficients that divides it.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree


# ---------------------------------------------------------------------------------------
# Taylor coefficients in h


def taylor_coefficients(fn: Callable, order: int, h0=0.0) -> list:
    """Taylor coefficients of `h ↦ fn(h)` at `h0`: `[fn(h0), fn'(h0), fn''(h0)/2!, …]`.

    fn(h0 + h) = Σ_{m ≤ order} c_m hᵐ + O(h^{order+1}),  c_m = fn⁽ᵐ⁾(h0)/m!,

    by `order` nested `jax.jvp` in the scalar h (the m-th derivative costs about 2ᵐ
    evaluations of fn, fine for the small orders of order conditions). Works through
    `geomjax.Newton` solves inside fn: their derivatives follow the implicit function
    theorem at every order.

    **Arguments:**

    - `fn`: `h ↦ pytree of arrays`.
    - `order`: the highest power, ≥ 0.
    - `h0`: the expansion point (default 0).

    **Returns:** a list of `order + 1` pytrees shaped like `fn(h0)`.

    Example (y = 1 + h y², solved by Newton; its Taylor coefficients are the Catalan
    numbers):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> def y(h):
    ...     res = geomjax.Newton().solve(lambda y: y - 1.0 - h * y**2, jnp.array([1.0]))
    ...     return res.value[0]
    >>> [round(float(c), 12) for c in geomjax.taylor_coefficients(y, 4)]
    [1.0, 1.0, 2.0, 5.0, 14.0]

    ```
    """
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"order must be an integer >= 0, got {order!r}")
    h0 = jnp.asarray(h0, dtype=float)

    # all_derivatives[m](h) = (f(h), f'(h), …, f⁽ᵐ⁾(h)) from one nested jvp: the jvp of
    # the tuple up to f⁽ᵐ⁻¹⁾ carries f⁽ᵐ⁾ as the tangent of its last entry.
    def lift(g):
        def lifted(h):
            primal, tangent = jax.jvp(g, (h,), (jnp.ones_like(h),))
            return primal + (tangent[-1],)

        return lifted

    g = lambda h: (fn(h),)  # noqa: E731
    for _ in range(order):
        g = lift(g)
    return [jax.tree_util.tree_map(lambda v, m=m: v / math.factorial(m), d) for m, d in enumerate(g(h0))]


def exact_flow(field: Callable, y0, order: int) -> Callable:
    """The Taylor polynomial of degree `order` of the exact flow h ↦ φ_h(y0) of ẏ = f(y).

    y(h) = Σ_{k ≤ order} y_k hᵏ with y_0 = y0 and (k + 1) y_{k+1} = [f(y(h))]_k (Picard
    iteration on truncated series; each pass fixes one more coefficient, the coefficients
    of f∘y by `taylor_coefficients`). The local error of a step is then
    Φ_h(y0) − exact_flow(f, y0, m)(h) = O(h^{m+1}) exactly when the method has order m.

    **Arguments:** `field`: `y ↦ f(y)` (an array of the shape of `y0`); `y0`: the initial
    value; `order`: the degree.

    **Returns:** a function `h ↦ Σ y_k hᵏ`.

    Example (ẏ = y², y(0) = 1: y = 1/(1 − h)):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> flow = geomjax.exact_flow(lambda y: y**2, jnp.array([1.0]), 4)
    >>> [float(c[0]) for c in geomjax.taylor_coefficients(flow, 4)]
    [1.0, 1.0, 1.0, 1.0, 1.0]

    ```
    """
    y0 = jnp.asarray(y0, dtype=float)
    coefficients = [y0]

    def polynomial(cs):
        return lambda h: sum(c * h**k for k, c in enumerate(cs))

    for k in range(order):
        fk = taylor_coefficients(lambda h: field(polynomial(coefficients)(h)), k)[k]
        coefficients.append(fk / (k + 1))
    return polynomial(coefficients)


def series_root(fn: Callable, z0, h, order: int):
    """The root z(h) of fn(z, h) = 0 near z(0) = z0, correct to O(h^{order+1}): exact
    Taylor coefficients through hᵒʳᵈᵉʳ for `taylor_coefficients`, with no linear solve to
    differentiate.

    `order` chord iterations z ← z − A⁻¹ fn(z, h) from z0 with A = ∂fn/∂z(z0, 0). The
    error contracts by a factor I − A⁻¹ ∂fn/∂z = O(h) per iteration, so after k iterations
    it is O(h^{k+1}) — also in its derivatives with respect to whatever z0 and fn depend on
    (a state x, for DΦ), because z0 and A are differentiated with them. Only evaluations
    of fn are differentiated in h: the nested derivatives compile several times faster
    than through an implicit-function solve (`geomjax.Newton` inside `jax.jvp`), and are
    exact to the order asked. Away from h = 0 this is not an accurate solver.

    **Arguments:**

    - `fn`: `(z, h) ↦ residual`, of the flat size of z.
    - `z0`: the root at h = 0, fn(z0, 0) = 0, written as a function of the inputs (for a
      one-step map, usually the state itself: z0 = x). Not checked.
    - `h`: the step size (the variable of `taylor_coefficients`).
    - `order`: the highest power of h that must be exact.

    Example (y = 1 + h y², y(0) = 1; Catalan numbers):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> y = lambda h: geomjax.series_root(lambda y, h: y - 1.0 - h * y**2, jnp.array([1.0]), h, 4)[0]
    >>> [round(float(c), 12) for c in geomjax.taylor_coefficients(y, 4)]
    [1.0, 1.0, 2.0, 5.0, 14.0]

    ```
    """
    z0 = jnp.asarray(z0, dtype=float)
    zero = jnp.zeros((), dtype=float)
    a = jax.jacfwd(lambda z: fn(z, zero).reshape(-1))(z0).reshape(z0.size, z0.size)
    a_inv = jnp.linalg.inv(a)
    z = z0
    for _ in range(order):
        z = z - (a_inv @ fn(z, h).reshape(-1)).reshape(z.shape)
    return z


# ---------------------------------------------------------------------------------------
# Random polynomial problems


def _monomials(n: int, degree: int) -> tuple:
    """Exponent tuples of all monomials in n variables of total degree ≤ degree."""
    out = []
    for d in range(degree + 1):
        for combo in itertools.combinations_with_replacement(range(n), d):
            e = [0] * n
            for i in combo:
                e[i] += 1
            out.append(tuple(e))
    return tuple(out)


class Polynomial(eqx.Module):
    """A polynomial P(x) = Σ_k c_k x^{e_k} on Rⁿ, scalar- or array-valued.

    A pytree (the coefficients are its leaf), so random problems built from polynomials
    pass through `jax.jit` and `jax.vmap` as data. Made by `random_polynomial`.

    **Fields:** `exponents` (static tuple of exponent tuples), `coefficients` (array of
    shape `(len(exponents),) + shape`).

    Example (P(x, y) = 2 + 3xy²):

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax import Polynomial
    >>> P = Polynomial(((0, 0), (1, 2)), jnp.array([2.0, 3.0]))
    >>> float(P(jnp.array([2.0, 1.0])))
    8.0

    ```
    """

    exponents: tuple = eqx.field(static=True)
    coefficients: jax.Array

    def __call__(self, x):
        x = jnp.asarray(x)
        e = np.asarray(self.exponents, dtype=int).reshape(len(self.exponents), -1)
        top = int(e.max(initial=0))
        powers = [jnp.ones_like(x)]
        for _ in range(top):
            powers.append(powers[-1] * x)
        terms = 1.0
        for i in range(e.shape[1]):  # x_i^{e_ki} picked by a constant 0/1 matrix (K, top + 1)
            pick = np.zeros((e.shape[0], top + 1))
            pick[np.arange(e.shape[0]), e[:, i]] = 1.0
            terms = terms * (jnp.asarray(pick) @ jnp.stack([pw[i] for pw in powers]))
        return jnp.tensordot(terms, self.coefficients, axes=1)


def random_polynomial(key, n: int, degree: int, shape=(), scale: float = 1.0) -> Polynomial:
    """A polynomial on Rⁿ with all monomials of total degree ≤ `degree` and standard normal
    coefficients times `scale`; values of shape `shape`.

    Used as a generic problem for order conditions: a Hamiltonian, a potential, a vector
    field or a constraint whose derivatives up to order `degree` are all nonzero and
    unrelated, so that no condition is hidden by a special structure. `n` ≥ 1 and
    `degree` ≥ 0 are integers (a ValueError otherwise).

    Example:

    ```python
    >>> import geomjax, jax
    >>> H = geomjax.random_polynomial(jax.random.key(0), 2, 3)
    >>> len(H.exponents), H(jax.numpy.zeros(2)).shape
    (10, ())

    ```
    """
    for name, value, least in (("n", n, 1), ("degree", degree, 0)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
            kind = "a positive integer (the number of variables)" if least else "a non-negative integer (the total degree)"
            raise ValueError(f"random_polynomial: {name} must be {kind}, got {value!r}")
    exponents = _monomials(int(n), int(degree))
    c = scale * jax.random.normal(key, (len(exponents),) + tuple(shape))
    return Polynomial(exponents, c)


# ---------------------------------------------------------------------------------------
# Conditions


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _monomial_name(exponents, names) -> str:
    factors = []
    for name, e in zip(names, exponents):
        if e == 1:
            factors.append(name)
        elif e > 1:
            factors.append(name + str(e).translate(_SUPERSCRIPT))
    return "·".join(factors) if factors else "1"


def _format_number(value) -> str:
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return f"{value:.12g}"


class OrderCondition:
    """One condition g(θ) = 0 on the coefficients θ of a family, from the power hᵐ.

    `str(c)` reads like `a + b − c − d = 0`; `repr(c)` like
    `OrderCondition(power=1, expression="a + b − c − d")`. The polynomial is normalised:
    its leading monomial (highest degree, then the order of `names`) has coefficient 1.
    A condition `1 = 0` says that no θ satisfies the power: the family cannot reach it.

    **Attributes:**

    - `power`: m, the power of h whose coefficient gives the condition.
    - `names`: the names of the coefficients θ.
    - `terms`: tuple of `(exponents, coefficient)`, coefficients as `fractions.Fraction`
      where they were within `rational_tol` of a small rational, else floats.
    - `values`: the same coefficients as fitted (floats), unrounded.
    - `coefficients`: dict monomial name → float coefficient (rounded), e.g.
      `{"a": 1.0, "d": -1.0}`; the constant term is named `"1"`.
    - `expression`: the polynomial as text.
    - `exact`: True when every coefficient was rounded to a rational.

    Calling a condition on a dict `{name: value}` evaluates g; `gradient` gives ∂g/∂θ.
    Made by `order_conditions`; by hand as below.

    Example:

    ```python
    >>> import geomjax
    >>> from fractions import Fraction
    >>> c = geomjax.OrderCondition(2, ("b2", "c2"), [((1, 1), Fraction(1)), ((0, 0), Fraction(-1, 2))], [1.0, -0.5])
    >>> print(c); c
    b2·c2 − 1/2 = 0
    OrderCondition(power=2, expression="b2·c2 − 1/2")
    >>> c({"b2": 1.0, "c2": 0.5}), c.coefficients
    (0.0, {'b2·c2': 1.0, '1': -0.5})

    ```
    """

    def __init__(self, power: int, names: Sequence[str], terms, values):
        self.power = power
        self.names = tuple(names)
        self.terms = tuple(terms)
        self.values = tuple(float(v) for v in values)

    @property
    def exact(self) -> bool:
        return all(isinstance(c, Fraction) for _, c in self.terms)

    @property
    def coefficients(self) -> dict:
        return {_monomial_name(e, self.names): float(c) for e, c in self.terms}

    @property
    def expression(self) -> str:
        parts = []
        for e, c in self.terms:
            negative = c < 0
            magnitude = -c if negative else c
            mono = _monomial_name(e, self.names)
            if mono == "1":
                text = _format_number(magnitude)
            elif magnitude == 1:
                text = mono
            else:
                text = f"{_format_number(magnitude)}·{mono}"
            if not parts:
                parts.append(("−" if negative else "") + text)
            else:
                parts.append((" − " if negative else " + ") + text)
        return "".join(parts) if parts else "0"

    def __call__(self, theta) -> float:
        total = 0.0
        for e, c in self.terms:
            term = float(c)
            for name, k in zip(self.names, e):
                term = term * theta[name] ** k
            total = total + term
        return total

    def gradient(self, theta) -> np.ndarray:
        """∂g/∂θ at `theta` (a dict), in the order of `names`."""
        out = np.zeros(len(self.names))
        for e, c in self.terms:
            for j in range(len(self.names)):
                if e[j] == 0:
                    continue
                term = float(c) * e[j]
                for i, (name, k) in enumerate(zip(self.names, e)):
                    term *= theta[name] ** (k - 1 if i == j else k)
                out[j] += term
        return out

    def __str__(self):
        return f"{self.expression} = 0"

    def __repr__(self):
        return f'OrderCondition(power={self.power}, expression="{self.expression}")'


def _rref(matrix: np.ndarray, tol: float) -> np.ndarray:
    """Reduced row echelon form (partial pivoting), zero rows dropped."""
    a = np.array(matrix, dtype=float)
    rows, cols = a.shape
    r = 0
    for c in range(cols):
        if r == rows:
            break
        pivot = r + int(np.argmax(np.abs(a[r:, c])))
        if abs(a[pivot, c]) <= tol:
            continue
        a[[r, pivot]] = a[[pivot, r]]
        a[r] = a[r] / a[r, c]
        for i in range(rows):
            if i != r:
                a[i] = a[i] - a[i, c] * a[r]
        r += 1
    out = a[:r]
    out[np.abs(out) <= tol] = 0.0
    return out


def _rationalise(x: float, tol: float, max_denominator: int):
    f = Fraction(float(x)).limit_denominator(max_denominator)
    return f if abs(float(f) - x) <= tol else float(x)


def _require_finite_samples(problems) -> None:
    """Raise a ValueError naming the samples whose problems have NaN/inf entries: the
    conditions would be fitted to non-finite values."""
    bad = [
        i
        for i, problem in enumerate(problems)
        if not all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree_util.tree_leaves(problem) if eqx.is_array_like(leaf))
    ]
    if bad:
        raise ValueError(
            f"sample(key) returned non-finite values (NaN or inf) for samples {bad} of {len(problems)}: the "
            "conditions would be fitted to NaN, and no condition could be trusted. Make sample return "
            "finite problems (coefficients and states)"
        )


def _require_finite_coefficients(values, names, raw) -> None:
    """Raise a ValueError when the defect's Taylor coefficients are NaN/inf for some
    sample or θ, naming where (instead of fitting conditions to them)."""
    finite = np.isfinite(values).all(axis=(2, 3))  # (samples, n_theta)
    if finite.all():
        return
    samples_bad = np.flatnonzero(~finite.all(axis=1)).tolist()
    s, k = np.argwhere(~finite)[0]
    theta = ", ".join(f"{name} = {raw[k, j]:.3g}" for j, name in enumerate(names))
    raise ValueError(
        f"the defect's Taylor coefficients in h are not finite (NaN or inf) for samples {samples_bad} "
        f"of {values.shape[0]} (first at θ = ({theta}) of sample {int(s)}): the conditions would be fitted "
        "to NaN. The defect(theta, problem, h) or its derivatives in h at h = 0 are not finite there: a "
        "division by a coefficient that can be zero (name it in nonzero=), a NaN in the problem, or a "
        "step that is undefined at h = 0"
    )


def order_conditions(
    defect: Callable,
    names: Sequence[str],
    sample: Callable,
    powers,
    *,
    samples: int = 4,
    degree: int | None = None,
    nonzero: Sequence[str] = (),
    theta_range=(-1.0, 1.0),
    key=None,
    zero_tol: float = 1e-9,
    rational_tol: float = 1e-12,
    max_denominator: int = 1000,
) -> list:
    """The conditions on θ for the hᵐ coefficients of a defect to vanish for all problems.

    With d(θ, P, h) = Σ_m d_m(θ, P) hᵐ, for each requested m the polynomials
    θ ↦ d_m(θ, P)[i] over sampled problems P and components i are fitted over the
    monomials of θ (total degree `degree`, or the smallest of m, m + 1, m + 2 that fits to
    round-off), and a basis of their linear span is returned, in reduced row echelon form
    with small rational coefficients. d_m(θ, P) = 0 for all P ⟺ every returned
    condition holds (as far as `samples` random problems span the problem class; the
    rank saturates quickly for generic polynomial problems).

    **Arguments:**

    - `defect`: `(theta, problem, h) ↦ pytree of arrays`, `theta` a dict name → scalar.
      Everything that makes the defect depend on the problem lives in `problem`.
    - `names`: the coefficient names, in the order used to sort monomials and print.
    - `sample`: `key ↦ problem`, a pytree of arrays (e.g. `random_polynomial`s and a
      random state); all samples must have one structure.
    - `powers`: an int or a sequence of ints m ≥ 0.
    - `samples`: the number of random problems.
    - `degree`: the degree of the fit in θ (default: the smallest that fits, from m).
    - `nonzero`: names of coefficients that may appear in denominators: d_m is multiplied
      by the smallest power of their product that makes it a polynomial, and each
      condition divided by the largest monomial in them that divides it; the conditions
      are then stated for these coefficients nonzero.
    - `theta_range`: the interval θ is sampled from (names in `nonzero`: |θ| in
      [0.5, 1.5], either sign).
    - `key`: a `jax.random` key (default `jax.random.key(0)`).
    - `zero_tol`: coefficients of size ≤ `zero_tol` times the largest defect coefficient
      seen count as zero (a power with all coefficients zero gives no condition).
    - `rational_tol`, `max_denominator`: rounding of the normalised coefficients.

    **Returns:** a list of `OrderCondition`, by power. No condition for a power means the
    coefficient vanishes identically.

    Consistent families (whose stages sit at the state when h = 0) have Taylor
    coefficients polynomial in θ at every state. An inconsistent one (Hamdouni and Salnikov's (2021)
    q̄ = a q + b q⁺ with a + b ≠ 1) evaluates the problem at θ-dependent points already at
    h = 0; sample its states at the origin of polynomial problems (their jets there are
    arbitrary), which is the expansion about the frozen point that Hamdouni and Salnikov (2021) does by hand.

    The conditions span the sampled polynomials; a ValueError says when the samples were
    too few to saturate that span, when no polynomial of the degrees tried fits, or when a
    sampled problem or the defect's coefficients are not finite (NaN or inf: naming the
    samples, and the first θ where the defect is not finite).

    Example (explicit Euler-like family y₁ = y + h(b₁ f(y) + b₂ f(y + h f(y))) on a random
    vector field, local error against the exact flow):

    ```python
    >>> import geomjax, jax, jax.numpy as jnp
    >>> def sample(key):
    ...     k1, k2 = jax.random.split(key)
    ...     return geomjax.random_polynomial(k1, 2, 2, shape=(2,)), jax.random.normal(k2, (2,))
    >>> def defect(th, problem, h):
    ...     f, y = problem
    ...     k1 = f(y)
    ...     y1 = y + h * (th["b1"] * k1 + th["b2"] * f(y + h * k1))
    ...     return y1 - geomjax.exact_flow(f, y, 2)(h)
    >>> for c in geomjax.order_conditions(defect, ("b1", "b2"), sample, [1, 2]):
    ...     print(c.power, c)
    1 b1 + b2 − 1 = 0
    2 b2 − 1/2 = 0

    ```
    """
    names = tuple(names)
    nonzero = tuple(nonzero)
    for name in nonzero:
        if name not in names:
            raise ValueError(f"nonzero name {name!r} is not among names {names}")
    powers = [powers] if isinstance(powers, int) else list(powers)
    if not powers or any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in powers):
        raise ValueError(f"powers must be integers >= 0, got {powers!r}")
    if isinstance(samples, (bool, np.bool_)) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"samples must be a positive integer (the number of random problems), got {samples!r}")
    try:
        lo, hi = (float(v) for v in theta_range)
    except (TypeError, ValueError):
        raise ValueError(f"theta_range must be two numbers (lo, hi), got {theta_range!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"theta_range must be two finite numbers lo < hi, got {theta_range!r}")
    top = max(powers)
    key = jax.random.key(0) if key is None else key
    kp, kt = jax.random.split(key)
    problems = [sample(k) for k in jax.random.split(kp, samples)]
    _require_finite_samples(problems)
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *problems)

    # Candidate fits per power: degree D and multiplier power k of the nonzero names.
    def candidates(m):
        degrees = [degree] if degree is not None else [m, m + 1, m + 2]
        ks = range(m + 2) if nonzero else [0]
        return [(d + k * len(nonzero), k) for k in ks for d in degrees]

    max_deg = max(d for m in powers for d, _ in candidates(m))
    n_monomials = len(_monomials(len(names), max_deg))
    n_theta = 2 * n_monomials + 8
    raw = np.array(jax.random.uniform(kt, (n_theta, len(names)), minval=lo, maxval=hi))
    for j, name in enumerate(names):
        if name in nonzero:  # |θ_j| in [0.5, 1.5], either sign: away from the poles at 0
            u = (raw[:, j] - lo) / (hi - lo)
            raw[:, j] = np.where(u < 0.5, -1.0, 1.0) * (0.5 + 2.0 * np.abs(u - 0.5))
    thetas = {name: jnp.asarray(raw[:, j]) for j, name in enumerate(names)}

    def coefficients(theta, problem):
        series = taylor_coefficients(lambda h: ravel_pytree(defect(theta, problem, h))[0], top)
        return jnp.stack(series)

    # One evaluation of a large graph (nested derivatives): XLA's backend optimisations
    # cost more compile time than they save (measured: the same run compiles faster).
    evaluate = jax.jit(
        jax.vmap(jax.vmap(coefficients, (0, None)), (None, 0)),
        compiler_options={"xla_backend_optimization_level": 0},
    )
    values = evaluate(thetas, batch)
    values = np.asarray(values)  # (samples, n_theta, top + 1, dim)
    _require_finite_coefficients(values, names, raw)
    scale = max(1.0, float(np.max(np.abs(values))))

    out = []
    for m in powers:
        data = values[:, :, m, :].transpose(1, 0, 2).reshape(n_theta, -1)  # (n_theta, S)
        if np.max(np.abs(data)) <= zero_tol * scale:
            continue
        fitted = None
        for deg, k in candidates(m):
            monos = sorted(_monomials(len(names), deg), key=lambda e: (-sum(e), tuple(-x for x in e)))
            basis = np.stack([np.prod(raw ** np.asarray(e), axis=1) for e in monos], axis=1)
            factor = np.ones(n_theta)
            for j, name in enumerate(names):
                if name in nonzero:
                    factor = factor * raw[:, j] ** k
            target = data * factor[:, None]
            w, *_ = np.linalg.lstsq(basis, target, rcond=None)
            residual = np.max(np.abs(basis @ w - target))
            if residual <= 1e-8 * max(1.0, np.max(np.abs(target))):
                fitted = (monos, w)
                break
        if fitted is None:
            raise ValueError(
                f"the h^{m} coefficient of the defect is not a polynomial in {names} of the degrees tried "
                f"{sorted({d for d, _ in candidates(m)})}: give a larger degree=, name denominators in nonzero=, "
                "or, for a family that evaluates the problem at θ-dependent points already at h = 0 (an "
                "inconsistent method, a + b ≠ 1), sample states at the origin of polynomial problems"
            )
        monos, w = fitted
        norms = np.linalg.norm(w, axis=0)
        w = w[:, norms > zero_tol * scale]
        if w.shape[1] == 0:
            continue
        w = w / np.linalg.norm(w, axis=0)
        u, s, _ = np.linalg.svd(w, full_matrices=False)
        rank = int(np.sum(s > 1e-8 * s[0]))
        if rank == w.shape[1] and rank < len(monos):
            raise ValueError(
                f"the h^{m} conditions did not saturate: {w.shape[1]} sampled polynomials are all "
                "independent, so the span may be larger; increase samples="
            )
        rows = _rref(u[:, :rank].T, 1e-10)
        if nonzero:
            # Divide each row by the largest monomial in the nonzero names dividing all its
            # terms, then reduce again: rows that differed only by such a factor coincide.
            shifted = []
            for row in rows:
                present = np.stack([np.asarray(e) for e, c in zip(monos, row) if c != 0.0])
                common = np.where([name in nonzero for name in names], present.min(axis=0), 0)
                shifted.append(
                    {tuple(int(x) for x in np.asarray(e) - common): c for e, c in zip(monos, row) if c != 0.0}
                )
            monos = sorted({e for r in shifted for e in r}, key=lambda e: (-sum(e), tuple(-x for x in e)))
            rows = _rref(np.array([[r.get(e, 0.0) for e in monos] for r in shifted]), 1e-10)
        for row in rows:
            terms = [(tuple(int(x) for x in e), c) for e, c in zip(monos, row) if c != 0.0]
            rounded = [(e, _rationalise(c, rational_tol, max_denominator)) for e, c in terms]
            out.append(OrderCondition(m, names, rounded, [c for _, c in terms]))
    return out


def reduce_conditions(conditions: Sequence[OrderCondition]) -> list:
    """The reduced Gröbner basis of the ideal the conditions generate (needs `sympy`).

    `order_conditions` returns, power by power, a basis of a *linear* span: it may list
    a − 1 and a² − 1 side by side, and the conditions of several powers overlap. The
    reduced Gröbner basis (graded reverse lexicographic order, in the order of `names`)
    of all the given polynomials has the same common zeros and is canonical: for
    conditions of the powers 1…m together it states "order m" compactly. The results
    carry the largest power among the inputs. All coefficients must be exact rationals.

    **Arguments:** `conditions`: `OrderCondition`s on the same names.

    **Returns:** a list of `OrderCondition`; `[1 = 0]` when no θ satisfies them all.

    Example (the second-order conditions of the two-stage explicit Runge–Kutta family,
    and the choice c₂ = 1 written as a condition: Heun's method):

    ```python
    >>> import geomjax
    >>> from fractions import Fraction as F
    >>> names = ("b1", "b2", "c2")
    >>> conditions = [
    ...     geomjax.OrderCondition(1, names, [((1, 0, 0), F(1)), ((0, 1, 0), F(1)), ((0, 0, 0), F(-1))], [1, 1, -1]),
    ...     geomjax.OrderCondition(2, names, [((0, 1, 1), F(1)), ((0, 0, 0), F(-1, 2))], [1, -0.5]),
    ...     geomjax.OrderCondition(2, names, [((0, 0, 1), F(1)), ((0, 0, 0), F(-1))], [1, -1]),
    ... ]
    >>> [str(c) for c in geomjax.reduce_conditions(conditions)]
    ['b1 − 1/2 = 0', 'b2 − 1/2 = 0', 'c2 − 1 = 0']

    ```
    """
    try:
        import sympy
    except ImportError as error:  # pragma: no cover
        raise ImportError("reduce_conditions needs sympy (pip install sympy)") from error
    if not conditions:
        return []
    names = conditions[0].names
    if any(c.names != names for c in conditions):
        raise ValueError("all conditions must be on the same coefficient names")
    if not all(c.exact for c in conditions):
        raise ValueError("reduce_conditions needs exact (rational) coefficients; some were not rounded")
    symbols = sympy.symbols([f"x{j}" for j in range(len(names))])

    def polynomial(terms):
        return sum(
            sympy.Rational(c.numerator, c.denominator) * sympy.prod([x**k for x, k in zip(symbols, e)]) for e, c in terms
        )

    polys = [polynomial(cond.terms) for cond in conditions]
    basis = sympy.groebner(polys, *symbols, order="grevlex")
    power = max(c.power for c in conditions)
    out = []
    for g in basis.exprs:
        poly = sympy.Poly(g, *symbols)
        terms = [(tuple(int(k) for k in e), Fraction(int(c.p), int(c.q))) for e, c in poly.terms()]
        terms.sort(key=lambda t: (-sum(t[0]), tuple(-x for x in t[0])))
        lead = terms[0][1]
        terms = [(e, c / lead) for e, c in terms]
        out.append(OrderCondition(power, names, terms, [float(c) for _, c in terms]))
    out.sort(key=lambda c: (sum(c.terms[0][0]), tuple(-x for x in c.terms[0][0])))
    return out


def solve_conditions(
    conditions: Sequence[OrderCondition],
    guess: dict,
    fixed: dict | None = None,
    *,
    tol: float = 1e-13,
    max_steps: int = 50,
) -> dict:
    """Coefficients θ where all `conditions` hold, by Newton's method from `guess`.

    Solves g_i(θ) = 0 for the coefficients not in `fixed` with minimum-norm Newton steps
    θ ← θ − J⁺ g(θ) (J⁺ the pseudo-inverse), so an underdetermined system (fewer
    conditions than free coefficients) converges to a solution near `guess`; `fixed`
    makes the remaining choices (for instance c₂ = 1 picks Heun's method from the
    second-order two-stage family).

    **Arguments:** `conditions`: `OrderCondition`s on the same names; `guess`: a dict
    name → starting value (names missing from it start at 0); `fixed`: a dict name → value
    held fixed; `tol`: the largest |g_i| accepted; `max_steps`: Newton iterations.

    **Returns:** a dict name → float. Raises `ValueError` when Newton does not reach `tol`.

    Example (symplectic Euler from the conditions of Hamdouni and Salnikov (2021), under consistency):

    ```python
    >>> import geomjax
    >>> from fractions import Fraction
    >>> c = geomjax.OrderCondition(2, ("a", "d"), [((1, 0), Fraction(1)), ((0, 1), Fraction(-1))], [1.0, -1.0])
    >>> geomjax.solve_conditions([c], {"a": 0.3, "d": 0.0}, fixed={"a": 1.0})
    {'a': 1.0, 'd': 1.0}

    ```
    """
    if not conditions:
        raise ValueError("no conditions to solve")
    names = conditions[0].names
    if any(c.names != names for c in conditions):
        raise ValueError("all conditions must be on the same coefficient names")
    fixed = dict(fixed or {})
    theta = {name: float(guess.get(name, 0.0)) for name in names}
    theta.update({name: float(v) for name, v in fixed.items()})
    free = [j for j, name in enumerate(names) if name not in fixed]
    for _ in range(max_steps + 1):
        g = np.array([c(theta) for c in conditions])
        if np.max(np.abs(g)) <= tol:
            return theta
        if not free:
            break
        jac = np.stack([c.gradient(theta)[free] for c in conditions])
        step = np.linalg.lstsq(jac, g, rcond=None)[0]
        for j, dj in zip(free, step):
            theta[names[j]] -= float(dj)
    raise ValueError(f"the conditions were not solved to {tol} from {guess} (residual {np.max(np.abs(g)):.3g})")
