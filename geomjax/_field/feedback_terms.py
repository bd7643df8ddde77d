"""The pieces of a feedback field Y = X − L∇V that do not depend on its class: its gains
K (and an embedded group's k₀), its metric L, its target F₀, and the rates of its
feedback term (λ_max(L∇²V), the Gauss–Newton Hessian DFᵀKDF and its Frobenius bound)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validate import as_state, check, host_array, is_concrete


def _gain_array(gains, m: int):
    """Return gains as a scalar, an `(m,)` vector (diagonal K) or an `(m, m)` matrix."""
    # Concrete gains are built on the host (each jnp call is a compilation in a fresh process).
    k = host_array(gains) if is_concrete(gains) else jnp.asarray(gains, dtype=jnp.float64)
    if k.ndim == 0:
        k = host_array(np.full((m,), np.asarray(k))) if is_concrete(k) else jnp.full((m,), k)
    elif k.ndim == 1:
        if k.shape[0] != m:
            raise ValueError(
                f"gains has {k.shape[0]} entries but F = (f, H, integrals) has {m}; give one gain "
                "per entry of F, a scalar, or an (m, m) matrix"
            )
    elif k.ndim == 2:
        if k.shape != (m, m):
            raise ValueError(f"gain matrix has shape {tuple(k.shape)}, expected ({m}, {m})")
    else:
        raise ValueError(f"gains must be a scalar, a vector or a matrix, got shape {tuple(k.shape)}")
    check(k, lambda xp, kn: ~xp.all(xp.isfinite(kn)), "gains must be finite")
    if k.ndim == 1:
        check(
            k,
            lambda xp, kn: kn < 0,
            "gains must be non-negative (a zero gain leaves that quantity out of V)",
            detail=lambda kn: f"; entries {np.flatnonzero(kn < 0).tolist()} are {kn[kn < 0].tolist()}",
        )
        check(
            k,
            lambda xp, kn: ~xp.any(kn > 0),
            "gains must include a positive entry: with all gains zero, V = 0 and there is no feedback",
        )
    if k.ndim == 2:
        _require_spd(k, "the gain matrix K", symmetry="", rtol=1e-5, atol=1e-8)
    return k


def has_embedding(structure) -> bool:
    """True for a structure whose configuration piece lies in an embedded group
    (`left_trivialised_so3/se2`): its feedback fields add k₀/4‖D‖² to V."""
    return bool(structure.embedded) and structure.nonholonomic_layout == "pair"


def embedding_potential(structure, z):
    """¼‖D‖² at the state `z` (in pieces), D the structure's embedding defect of the
    configuration piece (RᵀR − I for SO(3), cos² + sin² − 1 for SE(2))."""
    d = structure.embedding_defect(z[0]).reshape(-1)
    return 0.25 * jnp.dot(d, d)


def split_gains(gains, m: int, embedded: bool, quantities: str):
    """`(K, k₀)`: the gains over the m entries of F (`quantities` names them in messages)
    and, for an embedded structure, the last gain k₀ of k₀/4‖D‖² (else None)."""
    if not embedded:
        return _gain_array(gains, m), None
    g = host_array(gains) if is_concrete(gains) else jnp.asarray(gains, dtype=jnp.float64)
    if g.ndim == 0:
        g = host_array(np.full((m + 1,), np.asarray(g))) if is_concrete(g) else jnp.full((m + 1,), g)
    elif g.ndim != 1 or g.shape[0] != m + 1:
        raise ValueError(
            f"gains for an embedded structure: a scalar or a vector of {m + 1} gains (one per entry "
            f"of F = {quantities}, {m} here, then k₀ for k₀/4‖D‖²); got shape {tuple(g.shape)}"
        )
    k_all = _gain_array(g, m + 1)
    return k_all[:m], k_all[m]


def _require_spd(ell, what: str, symmetry: str = " (L = Lᵀ)", rtol: float = 1e-12, atol: float = 0.0) -> None:
    """Raise where the matrix `ell` is known and not finite, symmetric (to `rtol`, `atol`;
    `symmetry` adds to the message) and positive definite."""
    check(ell, lambda xp, a: ~xp.all(xp.isfinite(a)), f"{what} must be finite")
    check(
        ell,
        lambda xp, a: xp.logical_not(xp.allclose(a, a.T, rtol=rtol, atol=atol)),
        f"{what} must be symmetric{symmetry}",
        detail=lambda a: f"; its largest asymmetry is {np.abs(a - a.T).max():.3g}" if symmetry else "",
    )
    check(
        ell,
        lambda xp, a: xp.linalg.eigvalsh(0.5 * (a + a.T)).min() <= 0,
        f"{what} must be positive definite",
        detail=lambda a: f"; its smallest eigenvalue is {np.linalg.eigvalsh(0.5 * (a + a.T)).min():.3g}",
    )


def _check_metric(metric, x0, dim):
    """A metric L as given (None: the identity), checked where its values are known: a
    positive scalar, or a symmetric positive-definite (dim, dim) matrix, or a callable
    x ↦ L(x) whose value at x0 is one of those."""
    if x0 is not None:
        dim = x0.shape[0]
    if metric is None:
        return None
    if callable(metric):
        if x0 is None:
            return metric
        value = jnp.asarray(metric(x0))
        if value.ndim not in (0, 2) or (value.ndim == 2 and value.shape != (dim, dim)):
            raise ValueError(f"the metric callable must return a scalar or a ({dim}, {dim}) matrix, got shape {tuple(value.shape)}")
        _require_spd(value.reshape(value.shape if value.ndim == 2 else (1, 1)), "the metric L(x0)")
        return metric
    ell = jnp.asarray(metric, dtype=jnp.float64)
    if ell.ndim == 0:
        check(ell, lambda xp, v: ~(v > 0), "metric L must be a positive scalar", detail=lambda v: f", got {float(v)}")
        return ell
    if ell.shape != (dim, dim):
        raise ValueError(f"metric L has shape {tuple(ell.shape)}, expected ({dim}, {dim})")
    _require_spd(ell, "metric L")
    return ell


def resolve_target(system, x0, target, target_at, value_at_x0=None):
    """`(x0, target, pinned, m)` for a feedback field: x0 checked (or None); the pinned
    target if one was given, else F(x0) (or None without x0; `value_at_x0` if the caller
    computed it already); m the length of F."""
    if x0 is not None:
        x0 = as_state(x0, system.dim)
        spec = x0
    elif system.dim is not None:
        spec = jax.ShapeDtypeStruct((system.dim,), jnp.float64)
    else:
        raise ValueError("give x0 (or target=) to feedback_field: this structure does not say its dimension")
    m = jax.eval_shape(lambda x: target_at(x), spec).shape[0]
    if target is not None:
        target = jnp.asarray(target, dtype=jnp.float64)
        if target.shape != (m,):
            raise ValueError(f"target has shape {tuple(target.shape)}, but F has {m} entries: expected ({m},)")
        check(target, lambda xp, t: ~xp.all(xp.isfinite(t)), "target must be finite")
        return x0, target, True, m
    if x0 is None:
        return x0, None, False, m
    return x0, (target_at(x0) if value_at_x0 is None else value_at_x0), False, m


GAIN_LEAVES = ("gains", "embedding_gain")


def scale_gains(field, factor):
    """The feedback field with every gain (K and an embedded group's k₀) times `factor`."""
    for name in GAIN_LEAVES:
        if getattr(field, name, None) is not None:
            field = eqx.tree_at(lambda f, n=name: getattr(f, n), field, factor * getattr(field, name))
    return field


def gauss_newton_hessian(feedback, x):
    """DFᵀKDF (+ k₀/2·DDᵀDD on an embedded group): the Hessian of V without its terms in
    F − F₀, which vanish on the invariant set (there it is ∇²V exactly). One Jacobian of F
    (and of the embedding defect D) instead of a Hessian of V."""
    x = jnp.asarray(x)
    jac = jax.jacfwd(feedback.quantities)(x)
    k = feedback.gains
    hess = jac.T @ ((k[:, None] * jac) if k.ndim == 1 else (k @ jac))
    k0 = getattr(feedback, "embedding_gain", None)
    if k0 is not None:
        structure = feedback.system.structure
        defect = lambda y: structure.embedding_defect(feedback.split(y)[0]).reshape(-1)
        jd = jax.jacfwd(defect)(x)
        hess = hess + 0.5 * k0 * (jd.T @ jd)
    return hess


def lipschitz_estimate(feedback, x, safety=1.0):
    """L̂(x) = c·‖L·DFᵀKDF(x)‖_F, an upper estimate of the Lipschitz constant of L∇V near
    the invariant set.

    DFᵀKDF is ∇²V on the invariant set (`gauss_newton_hessian`), and the Frobenius norm
    bounds the spectral norm λ_max from above: Bae & Chang's cheap estimate (their code
    evaluates the same matrix in closed form); `safety` is their factor c (1.1 there).
    """
    hess = gauss_newton_hessian(feedback, x)
    metric = feedback.metric
    if metric is not None:
        ell = metric(x) if callable(metric) else metric
        hess = ell * hess if jnp.ndim(ell) == 0 else ell @ hess
    return safety * jnp.sqrt(jnp.sum(hess * hess))


def _metric_value(field, x):
    metric = field.metric
    if metric is None:
        return None
    return metric(x) if callable(metric) else metric


@eqx.filter_jit
def feedback_rate_at(field, x):
    """λ_max(L∇²V)(x) of the feedback field `field` at the flat state `x` (the public,
    checked form is `geomjax.feedback_rate`)."""
    # Compiled (a Hessian of V op by op outside jit takes seconds); inlined under jit.
    hess = jax.hessian(field.lyapunov)(x)
    ell = _metric_value(field, x)
    if ell is None:
        return jnp.linalg.eigvalsh(hess)[-1]
    if jnp.ndim(ell) == 0:
        return ell * jnp.linalg.eigvalsh(hess)[-1]
    # L∇²V is similar to L^½ ∇²V L^½ (L SPD): its eigenvalues are real.
    root = _spd_sqrt(ell)
    return jnp.linalg.eigvalsh(root @ hess @ root)[-1]


def _spd_sqrt(ell):
    w, v = jnp.linalg.eigh(ell)
    return (v * jnp.sqrt(w)) @ v.T
