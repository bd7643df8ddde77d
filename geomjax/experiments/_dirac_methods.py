"""The integrators compared in seed 003's experiments, on an implicit Lagrangian model (L, φ).

Every method is `run(model, x0, h, steps, save_every) -> xs` (saved flat states
(q, p), `steps // save_every + 1` rows, NaN after a failure), traceable so that
`jax.vmap` over models built from traced parameters works.

- **dirac1**: seed 003 eq. (7) with q̃ = (q_{k+1} − q_k)/h. `geomjax.dirac1` when
  geomjax has it; otherwise the identical map `geomjax.forced_dla(L, nonholonomic=Dφ,
  rule="left")`: p_k = ∂L/∂v(q_k, q̃) − h ∂L/∂q(q_k, q̃) + Dφ(q_k)ᵀλ, Dφ(q_k) q̃ = 0,
  p_{k+1} = ∂L/∂v(q_k, q̃).
- **dirac2**: eq. (7) with q̃ = (q_{k+1} − q_{k−1})/2h. `geomjax.dirac2` when geomjax has
  it; otherwise a stand-in: the equations for (q̃, λ) at step k are those of Dirac-1 at
  (q_k, p_k), so q̃ comes from the Dirac-1 map, q_{k+1} = q_{k−1} + 2h q̃ and
  p_{k+1} = ∂L/∂v(q_k, q̃). The start takes q_{−1} = q_0 − h v_0.
- **euler**, **trapezium**, **ab3**, **rk4**, **gauss4**: the named method on the
  index-reduced field `geomjax.dirac_field(model.system)` ("ab3" when geomjax has it).
- **rattle**: `geomjax.rattle(model.system)`.
- **feedback_euler**: explicit Euler on `geomjax.feedback_field(model.system, gains=k)`
  with k = FEEDBACK_GAIN_TIMES_H / h (explicit Euler on the feedback term is stable for
  h·λ_max(∇²V) < 2; λ_max ≈ 4k|q|² for the pendulum, so k·h = 0.1 keeps a margin of 5).
"""

import jax
import jax.numpy as jnp

import geomjax

FEEDBACK_GAIN_TIMES_H = 0.1


def has(name: str) -> bool:
    """Whether geomjax provides `name` (an integrator function or a field method)."""
    if name in ("dirac1", "dirac2"):
        return hasattr(geomjax, name)
    if name == "ab3":
        return "ab3" in geomjax.method_names()
    return True


def _field_run(method):
    def run(model, x0, h, steps, save_every):
        field = geomjax.dirac_field(model.system)
        sol = geomjax.integrate(field, x0, dt=h, steps=steps, save_every=save_every, method=method,
                                drift_tol=None, throw=False)
        return sol.xs

    return run


def dirac1_step(model):
    """The Dirac-1 step of `model` (`geomjax.dirac1`, or the identical forced DLA map)."""
    if has("dirac1"):
        return geomjax.dirac1(model.lagrangian, holonomic=model.holonomic)
    phi = model.holonomic
    return geomjax.forced_dla(model.lagrangian, nonholonomic=jax.tree_util.Partial(_jacobian, phi), rule="left")


def _jacobian(phi, q):
    return jax.jacfwd(phi)(q)


def _step_run(build):
    def run(model, x0, h, steps, save_every):
        sol = geomjax.integrate(build(model), x0, dt=h, steps=steps, save_every=save_every,
                                drift_tol=None, throw=False)
        return sol.xs

    return run


def _dirac2_standin(model, x0, h, steps, save_every):
    step = dirac1_step(model)
    n = x0.shape[0] // 2
    v0 = model.lagrangian_system.velocity(x0[:n], x0[n:])
    h = jnp.asarray(h, x0.dtype)

    def one(carry, _):
        q_prev, x = carry
        y = step(x, h)  # Dirac-1 from (q_k, p_k): q_k + h q̃, p = ∂L/∂v(q_k, q̃)
        q_new = q_prev + 2.0 * (y[:n] - x[:n])
        return (x[:n], jnp.concatenate([q_new, y[n:]])), None

    def block(carry, _):
        carry, _ = jax.lax.scan(one, carry, None, length=save_every)
        return carry, carry[1]

    _, xs = jax.lax.scan(block, (x0[:n] - h * v0, x0), None, length=steps // save_every)
    return jnp.concatenate([x0[None], xs])


def _dirac2_run(model, x0, h, steps, save_every):
    if has("dirac2"):
        step = geomjax.dirac2(model.lagrangian, holonomic=model.holonomic)
        return geomjax.integrate(step, x0, dt=h, steps=steps, save_every=save_every, drift_tol=None,
                                 throw=False).xs
    return _dirac2_standin(model, x0, h, steps, save_every)


def _feedback_run(model, x0, h, steps, save_every):
    field = geomjax.feedback_field(model.system, gains=FEEDBACK_GAIN_TIMES_H / h)
    return geomjax.integrate(field, x0, dt=h, steps=steps, save_every=save_every, method="euler",
                             drift_tol=None, throw=False).xs


RUNS = {
    "dirac1": _step_run(dirac1_step),
    "dirac2": _dirac2_run,
    "euler": _field_run("euler"),
    "trapezium": _field_run("trapezoidal"),
    "ab3": _field_run("ab3"),
    "rk4": _field_run("rk4"),
    "rattle": _step_run(lambda model: geomjax.rattle(model.system)),
    "gauss4": _field_run("gauss4"),
    "feedback_euler": _feedback_run,
}

DESCRIPTIONS = {
    "dirac1": "seed 003 eq. (7), q~ = (q_{k+1} - q_k)/h (geomjax.dirac1, or forced_dla(L, nonholonomic=Dphi, rule='left'))",
    "dirac2": "seed 003 eq. (7), q~ = (q_{k+1} - q_{k-1})/2h (geomjax.dirac2, or the stand-in described in _dirac_methods)",
    "euler": "explicit Euler on the index-reduced field geomjax.dirac_field(system)",
    "trapezium": "trapezoidal rule (implicit) on the index-reduced field",
    "ab3": "3-step Adams-Bashforth on the index-reduced field",
    "rk4": "classical RK4 on the index-reduced field",
    "rattle": "geomjax.rattle(system) (reference)",
    "gauss4": "2-stage Gauss (order 4) on the index-reduced field (reference)",
    "feedback_euler": "explicit Euler on geomjax.feedback_field(system, gains=0.1/h) (reference)",
}


def available(names):
    """The names among `names` that this geomjax can run (Dirac-1/2 always: stand-ins)."""
    return [name for name in names if name in ("dirac1", "dirac2") or has(name)]


def target(name, model, h):
    """The field or step a method integrates, for `_common.default_check`."""
    if name == "dirac2" and has("dirac2"):
        return geomjax.dirac2(model.lagrangian, holonomic=model.holonomic)
    if name in ("dirac1", "dirac2"):
        return dirac1_step(model)
    if name == "rattle":
        return geomjax.rattle(model.system)
    if name == "feedback_euler":
        return geomjax.feedback_field(model.system, gains=FEEDBACK_GAIN_TIMES_H / h)
    return geomjax.dirac_field(model.system)
