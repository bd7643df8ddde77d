"""The integrators compared in Salnikov and Hamdouni's (2019) experiments, on an implicit Lagrangian model (L, φ).

Every method is `run(model, x0, h, steps, save_every) -> xs` (saved flat states
(q, p), `steps // save_every + 1` rows, NaN after a failure), traceable so that
`jax.vmap` over models built from traced parameters works.

- **dirac1**, **dirac2**: Salnikov and Hamdouni (2019) eq. (7) with q̃ = (q_{k+1} − q_k)/h and
  q̃ = (q_{k+1} − q_{k−1})/2h: `geomjax.dirac1` and `geomjax.dirac2` (its literal reading).
- **dirac2_centred**: `geomjax.dirac2(..., reading="centred_constraint")`, a reconstruction
  of the ambiguous eq. (7): Dirac-1's momentum equations with the centred constraint
  α(q_k)·(q_{k+1} − q_{k−1}) = 0.
- **euler**, **trapezium**, **ab3**, **rk4**, **gauss4**: the named method on the
  index-reduced field `geomjax.dirac_field(model.system)`.
- **rattle**: `geomjax.rattle(model.system)`.
- **feedback_euler**: explicit Euler on `geomjax.feedback_field(model.system, gains=k)`
  with k = FEEDBACK_GAIN_TIMES_H / h (explicit Euler on the feedback term is stable for
  h·λ_max(∇²V) < 2; λ_max ≈ 4k|q|² for the pendulum, so k·h = 0.1 keeps a margin of 5).
"""


import geomjax

FEEDBACK_GAIN_TIMES_H = 0.1


def _field_run(method):
    def run(model, x0, h, steps, save_every):
        field = geomjax.dirac_field(model.system)
        sol = geomjax.integrate(field, x0, dt=h, steps=steps, save_every=save_every, method=method,
                                drift_tol=None, throw=False)
        return sol.xs

    return run


def _step_run(build):
    def run(model, x0, h, steps, save_every):
        sol = geomjax.integrate(build(model), x0, dt=h, steps=steps, save_every=save_every,
                                drift_tol=None, throw=False)
        return sol.xs

    return run


def _feedback_run(model, x0, h, steps, save_every):
    field = geomjax.feedback_field(model.system, gains=FEEDBACK_GAIN_TIMES_H / h)
    return geomjax.integrate(field, x0, dt=h, steps=steps, save_every=save_every, method="euler",
                             drift_tol=None, throw=False).xs


RUNS = {
    "dirac1": _step_run(lambda model: geomjax.dirac1(model.lagrangian, holonomic=model.holonomic)),
    "dirac2": _step_run(lambda model: geomjax.dirac2(model.lagrangian, holonomic=model.holonomic)),
    "dirac2_centred": _step_run(lambda model: geomjax.dirac2(model.lagrangian, holonomic=model.holonomic,
                                                             reading="centred_constraint")),
    "euler": _field_run("euler"),
    "trapezium": _field_run("trapezoidal"),
    "ab3": _field_run("ab3"),
    "rk4": _field_run("rk4"),
    "rattle": _step_run(lambda model: geomjax.rattle(model.system)),
    "gauss4": _field_run("gauss4"),
    "feedback_euler": _feedback_run,
}

DESCRIPTIONS = {
    "dirac1": "Salnikov and Hamdouni (2019) eq. (7), q~ = (q_{k+1} - q_k)/h (geomjax.dirac1)",
    "dirac2": "Salnikov and Hamdouni (2019) eq. (7), q~ = (q_{k+1} - q_{k-1})/2h (geomjax.dirac2, two-step, Dirac-1 starter)",
    "dirac2_centred": "Salnikov and Hamdouni (2019) eq. (7) read with the centred difference in the constraint only: "
                      "alpha(q_k).(q_{k+1} - q_{k-1}) = 0, momentum as Dirac-1 "
                      "(geomjax.dirac2(..., reading='centred_constraint'), a reconstruction)",
    "euler": "explicit Euler on the index-reduced field geomjax.dirac_field(system)",
    "trapezium": "trapezoidal rule (implicit) on the index-reduced field",
    "ab3": "3-step Adams-Bashforth on the index-reduced field",
    "rk4": "classical RK4 on the index-reduced field",
    "rattle": "geomjax.rattle(system) (reference)",
    "gauss4": "2-stage Gauss (order 4) on the index-reduced field (reference)",
    "feedback_euler": "explicit Euler on geomjax.feedback_field(system, gains=0.1/h) (reference)",
}


def available(names):
    """The names among `names` that have a run here."""
    return [name for name in names if name in RUNS]


def target(name, model, h):
    """The field or step a method integrates, for `_common.default_check`."""
    if name == "dirac1":
        return geomjax.dirac1(model.lagrangian, holonomic=model.holonomic)
    if name == "dirac2":
        return geomjax.dirac2(model.lagrangian, holonomic=model.holonomic)
    if name == "dirac2_centred":
        return geomjax.dirac2(model.lagrangian, holonomic=model.holonomic, reading="centred_constraint")
    if name == "rattle":
        return geomjax.rattle(model.system)
    if name == "feedback_euler":
        return geomjax.feedback_field(model.system, gains=FEEDBACK_GAIN_TIMES_H / h)
    return geomjax.dirac_field(model.system)
