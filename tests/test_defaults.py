"""Defaults that do not surprise (issue 26, item 3): gains chosen from a step size, the
failure message of gains past the stability bound, the default method per field, the
Hamiltonian field of a System, step statistics and end times of runs, and named
quantities in plots and messages."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax

PENDULUM = geomjax.models.spherical_pendulum()
DOUBLE = geomjax.models.planar_chain(2, gravity=9.81)


# --- 1. feedback_field without gains ----------------------------------------------------


def test_feedback_field_without_gains_or_dt_says_both_ways_to_call_it():
    with pytest.raises(TypeError) as info:
        geomjax.feedback_field(PENDULUM.system)
    text = str(info.value)
    assert "feedback_field(system, x0, gains=K)" in text
    assert "feedback_field(system, x0, dt=h" in text
    assert "recommended_gains" in text


@pytest.mark.parametrize("method, dt", [("euler", 1e-3), ("rk4", 1e-2)])
def test_feedback_field_with_dt_chooses_the_recommended_gains_and_says_so(method, dt):
    with pytest.warns(geomjax.ChosenGainsWarning, match=rf"chose K = .* for dt = {dt:g} with '{method}'"):
        Y = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, dt=dt, method=method)
    unit = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, 1.0)
    if method == "euler":
        # the gains are recommended_gains at the states of the pilot run (x0 among them):
        # for a first-order method never above those chosen at x0 alone
        assert np.all(np.asarray(Y.gains) <= geomjax.recommended_gains(unit, DOUBLE.x0, dt, method) * (1 + 1e-12))
        # the rule for first-order methods: h·λ_max(L∇²V) = 1 at the stiffest pilot state, ≤ 1 at x0
        assert dt * float(geomjax.feedback_rate(Y, DOUBLE.x0)) <= 1.0 + 1e-9
        at_x0 = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, dt=dt, method=method, pilot_steps=0)
        np.testing.assert_allclose(at_x0.gains, geomjax.recommended_gains(unit, DOUBLE.x0, dt, method), rtol=1e-12)
    sol = geomjax.integrate(Y, DOUBLE.x0, dt=dt, steps=200, method=method, save_every=20)
    assert bool(sol.ok)


def test_feedback_field_with_dt_needs_x0():
    with pytest.raises(ValueError, match="give x0"):
        geomjax.feedback_field(DOUBLE.system, dt=1e-3)


def test_gains_past_the_stability_bound_are_named_as_the_likely_cause():
    # the README's gains=50 copied to a double pendulum: h·λ_max ≈ 9.7 against β = 2
    Y = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, gains=50.0)
    with pytest.raises(geomjax.IntegrationError) as info:
        geomjax.integrate(Y, DOUBLE.x0, dt=1e-3, steps=1000, method="euler")
    text = str(info.value)
    assert "Likely cause: the gains. With K = 50" in text
    assert "stability bound β = 2 of 'euler'" in text
    assert "geomjax.recommended_gains" in text
    # gains within the bound that fail for another reason get no such sentence
    Z = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, gains=1.0)
    sol = geomjax.integrate(Z, DOUBLE.x0, dt=1e-3, steps=100, method="euler", drift_tol=1e-12, throw=False)
    assert not bool(sol.ok)
    assert "Likely cause" not in sol.message


# --- 3. the field of a System without constraints ----------------------------------------


def _oscillator():
    H = lambda x: 0.5 * x[1] ** 2 + 0.5 * x[0] ** 2
    return geomjax.System(H, geomjax.canonical(1), integrals=lambda x: x[0] ** 2 + x[1] ** 2)


def test_hamiltonian_vector_field_of_a_system_is_its_dirac_field():
    system = _oscillator()
    X = geomjax.hamiltonian_vector_field(system)
    assert isinstance(X, geomjax.DiracField)
    x = jnp.array([0.3, -1.2])
    expected = geomjax.hamiltonian_vector_field(system.hamiltonian, system.structure)(x)
    np.testing.assert_allclose(X(x), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(X(x), [-1.2, -0.3], rtol=0, atol=1e-15)
    # integrate monitors the system's integrals on it: a drift is reported by name
    sol = geomjax.integrate(X, x, dt=0.1, steps=200, method="euler", throw=False)
    assert sol.status_name == "invariant_drift"
    assert "first integral" in sol.message


def test_hamiltonian_vector_field_refuses_constrained_systems_and_bad_calls():
    with pytest.raises(ValueError, match="dirac_field"):
        geomjax.hamiltonian_vector_field(PENDULUM.system)
    with pytest.raises(TypeError, match="pass no structure"):
        geomjax.hamiltonian_vector_field(_oscillator(), geomjax.canonical(1))
    with pytest.raises(TypeError, match=r"hamiltonian_vector_field\(H, geomjax.canonical\(n\)\)"):
        geomjax.hamiltonian_vector_field(lambda x: x[0])


# --- 2. the default method follows the field ---------------------------------------------


def test_default_method_is_rk4_for_a_dirac_field_and_euler_for_a_feedback_field():
    X = geomjax.dirac_field(PENDULUM.system)
    kw = dict(dt=1e-2, steps=50, save_every=10)
    default = geomjax.integrate(X, PENDULUM.x0, **kw)
    np.testing.assert_array_equal(default.xs, geomjax.integrate(X, PENDULUM.x0, method="rk4", **kw).xs)
    assert not np.array_equal(default.xs, geomjax.integrate(X, PENDULUM.x0, method="euler", **kw).xs)
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains=50.0)
    kw = dict(dt=1e-3, steps=50, save_every=10)
    default = geomjax.integrate(Y, PENDULUM.x0, **kw)
    np.testing.assert_array_equal(default.xs, geomjax.integrate(Y, PENDULUM.x0, method="euler", **kw).xs)
    # a plain callable x ↦ ẋ: RK4 (e⁻¹ to O(h⁴))
    decay = geomjax.integrate(lambda x: -x, jnp.array([1.0]), dt=0.1, steps=10)
    assert abs(float(decay.xs[-1, 0]) - np.exp(-1.0)) < 1e-6


# --- 6. named quantities in plots; heat maps that are not cut off ------------------------


def _tuning_result(field):
    k = np.asarray(field.gains)
    history = {"objective": [0.0, -1.0, -2.0], "gains": [k, 2 * k, 3 * k], "stability_fraction": [0.1] * 3,
               "failed": [0] * 3, "skipped": [False] * 2}
    return geomjax.TuningResult(field, 3 * k, None, k, history, 0.0, -2.0, None, None, None, 0.3,
                                objective="invariants", method="euler", dt=1e-3, steps=10)


def test_tuning_plot_labels_the_gains_by_the_systems_quantity_names():
    import matplotlib

    matplotlib.use("Agg")
    from geomjax.experiments._figure_check import figure_problems

    named = geomjax.System(DOUBLE.system.hamiltonian, DOUBLE.system.structure, holonomic=DOUBLE.system.holonomic,
                           names=["rod 1", "rod 2", "rod 1 speed", "rod 2 speed", "energy"])
    for system, expected in [(DOUBLE.system, ["g1", "g2", "gdot1", "gdot2", "H"]),
                             (named, ["rod 1", "rod 2", "rod 1 speed", "rod 2 speed", "energy"])]:
        field = geomjax.feedback_field(system, DOUBLE.x0, gains=np.arange(1.0, 6.0))
        result = _tuning_result(field)
        assert list(result.gain_labels()) == expected
        fig = result.plot()
        assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == expected
        assert figure_problems(fig) == []
    # a gain matrix: its entries, K[j]; here the two diagonal entries are tuned alike (the
    # oscillator's symmetry), so they are one curve with both names, not one hiding the other
    field = geomjax.feedback_field(_oscillator(), jnp.array([1.0, 0.0]), gains=np.eye(2))
    fig = _tuning_result(field).plot()
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["K[0] ≈ K[3]"]
    assert figure_problems(fig) == []


def test_heatmap_colour_bar_and_labels_fit_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    from geomjax.experiments._figure_check import figure_problems

    def member(g, gain):
        model = geomjax.models.spherical_pendulum(g=g)
        return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0

    grid = geomjax.product(g=[1.0, 9.81], gain=[10.0, 100.0, 1e4])
    result = geomjax.sweep(member, grid, dt=1e-3, steps=300, save_every=100, method="euler")
    for quantity in ("status", "invariant_error", "constraint_error"):
        ax = result.heatmap(quantity)
        assert figure_problems(ax.figure) == [], quantity
    bar = result.heatmap("constraint_error").figure.axes[-1]
    assert bar.get_ylabel() == "log10 max constraint residual\n(red: failed)"


@pytest.mark.parametrize("transform", [jax.grad, lambda f: jax.jit(jax.grad(f))], ids=["grad", "jit(grad)"])
def test_chosen_gains_under_a_gradient_in_a_closed_over_value_are_refused_in_words(transform):
    """The gains `feedback_field(..., dt=h)` chooses come from numbers computed at x0; with a
    closed-over value traced they would be traced too: a clear error, not a wrong gradient."""

    def loss(g):
        system = geomjax.System(lambda x: 0.5 * x[3:] @ x[3:] + g * x[2], geomjax.canonical(3), holonomic=lambda q: q @ q - 1.0)
        x0 = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
        return geomjax.integrate(geomjax.feedback_field(system, x0, dt=1e-3), x0, dt=1e-3, steps=5).x_final[2]

    with pytest.raises(ValueError, match="which are traced here"):
        transform(loss)(9.81)
