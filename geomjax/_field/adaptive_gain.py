"""Bae & Chang's adaptive gain: the feedback term scaled by α = 1/(h·L̂(x))."""

import equinox as eqx
import jax
import jax.numpy as jnp

from .feedback import AbstractFeedbackField
from .._validate import check_step_size


GAIN_LEAVES = ("gains", "embedding_gain")


def scale_gains(field, factor):
    """The feedback field with every gain (K and an embedded group's k₀) times `factor`."""
    for name in GAIN_LEAVES:
        if getattr(field, name, None) is not None:
            field = eqx.tree_at(lambda f, n=name: getattr(f, n), field, factor * getattr(field, name))
    return field


def gauss_newton_hessian(feedback: AbstractFeedbackField, x):
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


def lipschitz_estimate(feedback: AbstractFeedbackField, x, safety=1.0):
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


class AdaptiveFeedbackField(AbstractFeedbackField):
    """Y(x) = X(x) − α(x)·L∇V(x),  α(x) = 1 / (h·max(L_min, c‖L·DFᵀKDF(x)‖_F)).

    The adaptive-gain rule of Bae & Chang ("Feedback Integrators Revisited",
    arXiv:2512.01528): the feedback term of a feedback field is scaled so that one
    explicit-Euler step of size h removes at most a fraction 1/c of the deviation along
    the stiffest direction (h·α·λ_max ≤ 1/c near the invariant set, where ∇²V = DFᵀKDF,
    since λ_max ≤ ‖·‖_F), which is the scaling
    that minimises their Taylor bound for feedback Euler. L̂ is re-estimated at every
    evaluation (their stepwise variant); their periodic variant holds it over a time
    window. Built by `AbstractFeedbackField.adaptive`; behaves as the wrapped feedback
    field in every other respect (targets, checks, monitored quantities).

    Example (at h = 0.02 the fixed gains 50 are past explicit Euler's bound):

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 50.0)
    >>> fixed = geomjax.integrate(Y, model.x0, dt=0.02, steps=500, method="euler", throw=False)
    >>> adaptive = geomjax.integrate(Y.adaptive(dt=0.02), model.x0, dt=0.02, steps=500, method="euler")
    >>> bool(fixed.ok), bool(adaptive.ok)
    (False, True)

    ```
    """

    feedback: AbstractFeedbackField
    dt: jax.Array
    safety: float = eqx.field(static=True, default=1.1)
    floor: float = eqx.field(static=True, default=1e-10)

    def __check_init__(self):
        # α = 1/(h·L̂): a zero or NaN h makes the field non-finite at the first step, a
        # negative one turns the feedback around. Checked where h is known.
        try:
            check_step_size(self.dt)
        except (TypeError, ValueError) as err:
            raise type(err)(
                f"{err}: the adaptive gain α = 1/(h·L̂) needs h, the step the field will be run "
                "with (pass the run's dt to .adaptive(dt=...))"
            ) from None

    @property
    def system(self):
        return self.feedback.system

    @property
    def target(self):
        return self.feedback.target

    @property
    def gains(self):
        return self.feedback.gains

    @property
    def metric(self):
        return self.feedback.metric

    @property
    def pinned(self):
        return self.feedback.pinned

    def check(self, x0) -> None:
        self.feedback.check(x0)

    def quantities(self, x):
        return self.feedback.quantities(x)

    def target_at(self, x0):
        return self.feedback.target_at(x0)

    def extra_potential(self, x):
        return self.feedback.extra_potential(x)

    def lyapunov(self, x):
        return self.feedback.lyapunov(x)

    def at_start(self, z0):
        return eqx.tree_at(lambda f: f.feedback, self, self.feedback.at_start(z0))

    def scale(self, x):
        """α(x) = 1 / (h·max(L_min, c‖L·DFᵀKDF(x)‖_F)) at the flat state `x`."""
        estimate = lipschitz_estimate(self.feedback, x, self.safety)
        return 1.0 / (self.dt * jnp.maximum(self.floor, estimate))

    def vector(self, z):
        return scale_gains(self.feedback, self.scale(self.merge(z))).vector(z)
