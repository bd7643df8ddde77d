"""Partitioned Runge–Kutta tableaux (A, b, c; Â, b̂) for the Dirac–Runge–Kutta steps.

The coefficients are computed from the nodes in numpy (float64), never typed in:

- the nodes are the roots of a polynomial (Gauss: shifted Legendre P_s(2x − 1); Radau
  IIA: d^{s−1}/dx^{s−1}[x^{s−1}(x − 1)^s]; Lobatto: d^{s−2}/dx^{s−2}[x^{s−1}(x − 1)^{s−1}]),
  polished by Newton's method in extended precision;
- A and b from the collocation conditions C(s) and B(s): Σⱼ aᵢⱼ cⱼ^{k−1} = cᵢ^k/k and
  Σⱼ bⱼ cⱼ^{k−1} = 1/k (k = 1..s), a Vandermonde solve;
- Lobatto IIIB from IIIA by the symplecticity relation bᵢâᵢⱼ + b̂ⱼaⱼᵢ = bᵢb̂ⱼ with b̂ = b.

Gauss and Radau IIA use the same tableau for q and p (Â = A). The error of the
coefficients is about 1e-16 (checked in `tests/test_dirac_rk.py`).
"""

import equinox as eqx
import numpy as np
from numpy.polynomial import polynomial as P

_NAMES = ("gauss", "radau_iia", "lobatto_iiia_iiib")
_STAGES = {"gauss": (1, 2, 3), "radau_iia": (1, 2, 3), "lobatto_iiia_iiib": (2, 3)}


def _poly_roots(coeffs) -> np.ndarray:
    """Real roots of the polynomial with (low → high) `coeffs` in [0, 1], polished."""
    roots = np.sort(np.real(P.polyroots(coeffs)))
    d = P.polyder(coeffs)
    ld = np.longdouble
    c_ld = np.asarray(coeffs, ld)
    d_ld = np.asarray(d, ld)
    out = []
    for r in roots:
        x = ld(r)
        for _ in range(4):
            fx = sum(c * x**k for k, c in enumerate(c_ld))
            dx = sum(c * x**k for k, c in enumerate(d_ld))
            if dx == 0:
                break
            x = x - fx / dx
        out.append(float(x))
    return np.asarray(out)


def _power(base, e):
    out = np.array([1.0])
    for _ in range(e):
        out = P.polymul(out, base)
    return out


def _derivative(coeffs, m):
    out = np.asarray(coeffs, float)
    for _ in range(m):
        out = P.polyder(out)
    return out


def gauss_nodes(s: int) -> np.ndarray:
    """Zeros of the shifted Legendre polynomial P_s(2x − 1): d^s/dx^s [x^s (x − 1)^s]."""
    poly = P.polymul(_power([0.0, 1.0], s), _power([-1.0, 1.0], s))
    return _poly_roots(_derivative(poly, s))


def radau_iia_nodes(s: int) -> np.ndarray:
    """Radau IIA (right Radau) nodes: zeros of d^{s−1}/dx^{s−1}[x^{s−1} (x − 1)^s]; c_s = 1."""
    poly = P.polymul(_power([0.0, 1.0], s - 1), _power([-1.0, 1.0], s))
    nodes = _poly_roots(_derivative(poly, s - 1))
    nodes[-1] = 1.0
    return nodes


def lobatto_nodes(s: int) -> np.ndarray:
    """Lobatto nodes: 0, 1 and the zeros of d^{s−2}/dx^{s−2}[x^{s−1} (x − 1)^{s−1}] inside."""
    if s < 2:
        raise ValueError("Lobatto methods need s >= 2 stages")
    poly = P.polymul(_power([0.0, 1.0], s - 1), _power([-1.0, 1.0], s - 1))
    nodes = _poly_roots(_derivative(poly, s - 2))
    nodes[0], nodes[-1] = 0.0, 1.0
    return nodes


def collocation(nodes) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of the collocation method with these nodes: C(s) and B(s)."""
    c = np.asarray(nodes, float)
    s = c.shape[0]
    k = np.arange(1, s + 1)
    vander = c[None, :] ** (k[:, None] - 1)  # V[k, j] = c_j^{k-1}
    rhs_a = (c[None, :] ** k[:, None]) / k[:, None]  # [k, i] = c_i^k / k
    a = np.linalg.solve(vander, rhs_a).T  # Σ_j a_ij c_j^{k-1} = c_i^k / k
    b = np.linalg.solve(vander, 1.0 / k)
    return a, b


def _tup(m):
    m = np.asarray(m, float)
    if m.ndim == 1:
        return tuple(float(x) for x in m)
    return tuple(tuple(float(x) for x in row) for row in m)


class PartitionedTableau(eqx.Module):
    """A partitioned Runge–Kutta tableau: (A, b, c) for the positions, (Â, b̂) for the momenta.

    **Fields** (tuples of floats; static):

    - `a`, `b`, `c`: the s × s matrix A (rows), weights b and nodes c of the q-method;
    - `a_hat`, `b_hat`: Â and b̂ of the p-method;
    - `name`: a label; `order`: the classical order of the pair (unconstrained), or None.

    Constructors: `PartitionedTableau.gauss(s)`, `.radau_iia(s)` (s = 1, 2, 3),
    `.lobatto_iiia_iiib(s)` (s = 2, 3), `.dirac1()` (the Dirac-1 integrator of Salnikov and Hamdouni (2019)),
    `.from_name(name, s)`. Any (A, b, c, Â, b̂) may also be given directly.

    Example:

    ```python
    >>> import geomjax
    >>> tab = geomjax.PartitionedTableau.lobatto_iiia_iiib(2)
    >>> tab.a, tab.a_hat
    (((0.0, 0.0), (0.5, 0.5)), ((0.5, 0.0), (0.5, 0.0)))

    ```
    """

    a: tuple = eqx.field(static=True)
    b: tuple = eqx.field(static=True)
    c: tuple = eqx.field(static=True)
    a_hat: tuple = eqx.field(static=True)
    b_hat: tuple = eqx.field(static=True)
    name: str = eqx.field(static=True, default="custom")
    order: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        s = len(self.b)
        if s < 1:
            raise ValueError("a tableau needs at least one stage")
        shapes = (len(self.a), len(self.c), len(self.a_hat), len(self.b_hat))
        if any(x != s for x in shapes) or any(len(r) != s for r in self.a) or any(len(r) != s for r in self.a_hat):
            raise ValueError(f"PartitionedTableau: A, Â must be s × s and b, c, b̂ of length s (s = {s})")

    @property
    def stages(self) -> int:
        return len(self.b)

    @property
    def stiffly_accurate(self) -> bool:
        """Whether the last rows of A and Â are b and b̂ (then the last stage is the step end)."""
        return self.a[-1] == self.b and self.a_hat[-1] == self.b_hat

    @classmethod
    def gauss(cls, s: int = 2) -> "PartitionedTableau":
        """s-stage Gauss–Legendre collocation for q and p (order 2s, symplectic)."""
        _check_stages("gauss", s)
        a, b = collocation(gauss_nodes(s))
        c = a.sum(axis=1)
        return cls(_tup(a), _tup(b), _tup(c), _tup(a), _tup(b), f"gauss{s}", 2 * s)

    @classmethod
    def radau_iia(cls, s: int = 2) -> "PartitionedTableau":
        """s-stage Radau IIA collocation for q and p (order 2s − 1, stiffly accurate)."""
        _check_stages("radau_iia", s)
        a, b = collocation(radau_iia_nodes(s))
        a[-1] = b  # exactly stiffly accurate (equal to round-off anyway)
        c = a.sum(axis=1)
        return cls(_tup(a), _tup(b), _tup(c), _tup(a), _tup(b), f"radau_iia{s}", 2 * s - 1)

    @classmethod
    def lobatto_iiia_iiib(cls, s: int = 2) -> "PartitionedTableau":
        """s-stage Lobatto IIIA (q) – IIIB (p) pair (order 2s − 2, symplectic); s = 2 is
        RATTLE's tableau."""
        _check_stages("lobatto_iiia_iiib", s)
        a, b = collocation(lobatto_nodes(s))
        a[0] = 0.0
        a[-1] = b
        a_hat = b[None, :] * (1.0 - a.T / b[:, None])  # b_i â_ij + b_j a_ji = b_i b_j
        a_hat[:, -1] = 0.0
        c = a.sum(axis=1)
        return cls(_tup(a), _tup(b), _tup(c), _tup(a_hat), _tup(b), f"lobatto_iiia_iiib{s}", 2 * s - 2)

    @classmethod
    def dirac1(cls) -> "PartitionedTableau":
        """One stage, a = 0, b = 1, â = 1, b̂ = 1: Salnikov and Hamdouni's (2019) Dirac-1 integrator (order 1)."""
        return cls(((0.0,),), (1.0,), (0.0,), ((1.0,),), (1.0,), "dirac1", 1)

    @classmethod
    def from_name(cls, name: str, stages: int = 2) -> "PartitionedTableau":
        """The tableau called `name` ("gauss", "radau_iia", "lobatto_iiia_iiib") with `stages`."""
        if name not in _NAMES:
            raise ValueError(f"unknown Dirac–Runge–Kutta tableau {name!r}; choose one of {_NAMES} or pass a PartitionedTableau")
        return getattr(cls, name)(stages)


def _check_stages(name, s):
    if isinstance(s, bool) or s not in _STAGES[name]:
        raise ValueError(f"the {name} tableau is available with stages in {_STAGES[name]}, got {s!r}")
