"""`geomjax.sweep`: batches of runs with one status per member.

Independent checks: a Python loop of single `geomjax.integrate` runs (states, statuses,
failed steps), `jax.vmap` of `integrate` for every method in the component-major layout,
a sharded sweep on 4 CPU devices in a subprocess, and central finite differences for the
gradient of a loss over a sweep.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax

R = geomjax.RESULTS
PENDULUM = geomjax.models.spherical_pendulum()
HOLONOMIC = geomjax.models.spherical_pendulum(holonomic=True)


def feedback_member(g, gain):
    model = geomjax.models.spherical_pendulum(g=g)
    return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0


# gain 1e4 with dt = 1e-3 is past explicit Euler's stability limit: those members diverge
GRID = geomjax.product(g=[1.0, 9.81], gain=[10.0, 100.0, 1e4])
DT, STEPS, SAVE = 1e-3, 300, 100


def loop_of_single_runs(build, grid, **kw):
    out = []
    for i in range(grid.size):
        member = {k: v[0] for k, v in grid.take(np.array([i])).items()}
        target, x0 = build(**member)
        out.append(geomjax.integrate(target, x0, throw=False, **kw))
    return out


@pytest.fixture(scope="module")
def sweeps():
    return {layout: geomjax.sweep(feedback_member, GRID, dt=DT, steps=STEPS, save_every=SAVE, layout=layout) for layout in ("batch", "component")}


@pytest.mark.parametrize("layout", ["batch", "component"])
def test_sweep_equals_a_loop_of_single_runs(sweeps, layout):
    result = sweeps[layout]
    singles = loop_of_single_runs(feedback_member, GRID, dt=DT, steps=STEPS, save_every=SAVE)
    status = np.array([int(s.status) for s in singles]).reshape(GRID.shape)
    failed = np.array([int(s.failed_step) for s in singles]).reshape(GRID.shape)
    assert (status == R.diverged._value).sum() >= 2 and (status == 0).sum() >= 3
    np.testing.assert_array_equal(np.asarray(result.status), status)
    np.testing.assert_array_equal(np.asarray(result.failed_step), failed)
    xs = np.stack([np.asarray(s.xs) for s in singles]).reshape(GRID.shape + (STEPS // SAVE + 1, 6))
    ok = np.isfinite(xs)
    np.testing.assert_array_equal(np.isfinite(np.asarray(result.xs)), ok)  # NaN after a failure, in both
    np.testing.assert_allclose(np.asarray(result.xs)[ok], xs[ok], rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(result.ts), np.asarray(singles[0].ts), rtol=1e-15)
    # invariant errors: the drift of (f1, f2, H, J) from the member's start, by hand
    from conftest import spherical_quantities

    g = np.asarray(GRID.values("g"))[:, None, None]
    inv = np.stack([spherical_quantities(xs[i], g=float(g[i, 0, 0])) for i in range(2)])
    drift = np.abs(inv - inv[..., :1, :]) / (1 + np.abs(inv[..., :1, :]))
    finite = np.isfinite(drift)
    np.testing.assert_allclose(np.asarray(result.invariant_error)[finite], drift[finite], atol=1e-13)
    assert result.summary() == "3 of 6 members succeeded; 3 diverged"
    assert "diverged" not in result.message(0, 0) and result.message(1, 2).startswith("failed at step")


def test_layouts_agree_and_results_are_shaped_like_the_grid(sweeps):
    a, b = sweeps["batch"], sweeps["component"]
    assert a.xs.shape == (2, 3, 4, 6) and a.invariant_error.shape == (2, 3, 4, 4) and a.constraint_error.shape == (2, 3, 4)
    np.testing.assert_array_equal(np.asarray(a.status), np.asarray(b.status))
    np.testing.assert_allclose(np.asarray(a.xs), np.asarray(b.xs), atol=1e-13, equal_nan=True)
    assert a.x_final.shape == (2, 3, 6) and a.ok.dtype == bool


def cartesian_lagrangian(q, v):
    return 0.5 * v @ v - 9.81 * q[1]


def unit_circle(q):
    return jnp.array([q @ q - 1.0])


def cartesian_member(angle):
    x0 = jnp.stack([jnp.sin(angle), -jnp.cos(angle), 0.0, 0.0])
    return x0


STEP_CASES = {
    "rattle": lambda x0: (geomjax.rattle(HOLONOMIC.system), x0),
    "dirac1": lambda angle: (geomjax.dirac1(cartesian_lagrangian, holonomic=unit_circle), cartesian_member(angle)),
    "dirac2": lambda angle: (geomjax.dirac2(cartesian_lagrangian, holonomic=unit_circle), cartesian_member(angle)),
    "dirac_rk gauss 2": lambda angle: (geomjax.dirac_rk(cartesian_lagrangian, "gauss", 2, holonomic=unit_circle), cartesian_member(angle)),
    "herglotz": lambda alpha: (geomjax.herglotz(jax.tree_util.Partial(damped_lagrangian, alpha)), jnp.array([0.3, 0.7, 0.0])),
}


def damped_lagrangian(alpha, q, v, z):
    return 0.5 * v @ v - 0.5 * q @ q - alpha * z


def _starts(case):
    if case == "rattle":
        return {"x0": np.asarray(HOLONOMIC.x0)[None] * np.ones((3, 1))}
    if case == "herglotz":
        return {"alpha": np.array([0.0, 0.1, 0.5])}
    return {"angle": np.array([0.1, 0.2, 0.3])}  # small swings: Dirac-1's energy error is O(h)


def _vmap_of_integrate(build, grid, **kw):
    members = grid.take(np.arange(grid.size))

    @jax.jit
    def run(members):
        def one(member):
            target, x0 = build(**member)
            return geomjax.integrate(target, x0, throw=False, **kw)

        return jax.vmap(one)(members)

    return run(members)


@pytest.mark.parametrize(
    "case",
    # One method of each kind of loop body (explicit RK, multistep, implicit RK with its
    # Newton solve, RATTLE, Dirac, Dirac–RK, Herglotz); the others share their code paths.
    ["euler", "rk4", "ab4", "gauss2", *[c for c in STEP_CASES if c != "dirac2"]],
)
def test_component_major_equals_vmap_of_integrate(case):
    """Every method: the component-major sweep and `vmap` of `integrate` agree to 1e-13."""
    kw = dict(dt=0.01, steps=12, save_every=4)
    if case in STEP_CASES:
        build, grid, method = STEP_CASES[case], geomjax.zipped(**_starts(case)), {}
    else:
        dirac = geomjax.dirac_field(PENDULUM.system)
        explicit = case in ("euler", "heun", "midpoint", "rk3", "rk4")

        def build(gain):
            field = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains=gain) if explicit else dirac
            return field, PENDULUM.x0

        grid, method = geomjax.zipped(gain=[1.0, 5.0, 20.0]), {"method": case}
    reference = _vmap_of_integrate(build, grid, **kw, **method)
    result = geomjax.sweep(build, grid, layout="component", **kw, **method)
    assert np.all(np.asarray(reference.status) == 0), case
    np.testing.assert_array_equal(np.asarray(result.status).reshape(-1), np.asarray(reference.status))
    np.testing.assert_allclose(np.asarray(result.xs).reshape(reference.xs.shape), np.asarray(reference.xs), rtol=0, atol=1e-13)


def test_build_closing_over_swept_values_runs_each_member_in_one_vmap():
    """A lambda that captures a swept value cannot leave the vmap that built it: the sweep
    then builds and runs each member inside one vmap (and says so for layout="component")."""

    def build(alpha):
        return geomjax.herglotz(lambda q, v, z: 0.5 * v @ v - 0.5 * q @ q - alpha * z), jnp.array([0.3, 0.7, 0.0])

    grid = geomjax.zipped(alpha=[0.0, 0.1, 0.5])
    with pytest.warns(UserWarning, match="close over swept values"):
        result = geomjax.sweep(build, grid, dt=0.01, steps=12, save_every=4, layout="component")
    reference = geomjax.sweep(STEP_CASES["herglotz"], grid, dt=0.01, steps=12, save_every=4, layout="component")
    np.testing.assert_allclose(np.asarray(result.xs), np.asarray(reference.xs), atol=1e-13)
    assert result.invariant_error.shape == reference.invariant_error.shape and result.summary() == "3 of 3 members succeeded"


def test_failing_members_keep_their_own_status():
    """A NaN parameter, a start off the constraint set and a diverging gain each fail their
    own member only, with the cause and the step; the others run as alone."""
    x0 = np.asarray(PENDULUM.x0)
    off = x0.copy()
    off[4] += 1e-3  # q·p ≠ 0: off T*S²

    def member(g, x0):
        model = geomjax.models.spherical_pendulum(g=g, holonomic=True)  # residuals g(q), ġ
        return geomjax.dirac_field(model.system), x0

    grid = geomjax.zipped(g=[1.0, np.nan, 1.0, 2.0], x0=np.stack([x0, x0, off, x0]))
    result = geomjax.sweep(member, grid, dt=0.01, steps=20, method="rk4")
    expected = [R.successful, R.nonfinite_first_step, R.off_constraint_set, R.successful]
    assert [bool(np.asarray(result.result == r)[i]) for i, r in enumerate(expected)] == [True] * 4
    np.testing.assert_array_equal(np.asarray(result.result == R.successful), [True, False, False, True])
    np.testing.assert_array_equal(np.asarray(result.failed_step), [-1, 1, 0, -1])
    alone = geomjax.integrate(*member(2.0, x0), dt=0.01, steps=20, method="rk4")
    np.testing.assert_allclose(np.asarray(result.x_final[3]), np.asarray(alone.xs[-1]), atol=1e-14)
    assert "off the constraint set" in result.message(2)
    # a non-finite start, even of the first member, is that member's status
    nan_first = geomjax.zipped(g=[1.0, 1.0], x0=np.stack([np.full(6, np.nan), x0]))
    result = geomjax.sweep(member, nan_first, dt=0.01, steps=4, method="rk4")
    np.testing.assert_array_equal(np.asarray(result.result == R.nonfinite_start), [True, False])
    assert result.summary() == "1 of 2 members succeeded; 1 nonfinite start"
    # also when build checks values eagerly (feedback_field rejects a NaN x0 outside jit)
    feedback = lambda x0: (geomjax.feedback_field(PENDULUM.system, x0, gains=5.0), x0)
    result = geomjax.sweep(feedback, geomjax.zipped(x0=np.stack([np.full(6, np.nan), x0])), dt=0.01, steps=4)
    np.testing.assert_array_equal(np.asarray(result.result == R.nonfinite_start), [True, False])


def test_drift_message_names_the_quantity_as_integrate_does():
    """A member that drifts: its message names the quantity (by the model's names), its
    value at the failing save and the tolerance, in the words of `Solution.message`."""

    def member(g):
        model = geomjax.models.spherical_pendulum(g=g)
        return geomjax.dirac_field(model.system), model.x0

    result = geomjax.sweep(member, geomjax.zipped(g=[1.0, 0.25]), dt=1e-3, steps=6000, save_every=100, method="euler")
    alone = geomjax.integrate(*member(1.0), dt=1e-3, steps=6000, save_every=100, method="euler", throw=False)
    assert int(result.failed_step[0]) == int(alone.failed_step) == 5000
    detail = alone.message.split("geomjax.check_gains)")[1]
    assert detail.startswith(". At that save the first integral H had drifted by 0.0102629")
    assert result.message(0).endswith(detail)


def test_default_method_is_integrates():
    """Without `method=`, a sweep uses `integrate`'s default for each field: RK4 for a
    Dirac field (explicit Euler for a feedback field)."""
    model = geomjax.models.spherical_pendulum()
    field = geomjax.dirac_field(model.system)
    result = geomjax.sweep(lambda g: (field, model.x0), geomjax.zipped(g=[1.0]), dt=0.05, steps=20)
    rk4 = geomjax.integrate(field, model.x0, dt=0.05, steps=20, method="rk4")
    np.testing.assert_allclose(np.asarray(result.xs)[0, -1], np.asarray(rk4.xs)[-1], rtol=0, atol=1e-14)


def test_chunks_and_progress_give_the_same_result(sweeps, capsys):
    chunked = geomjax.sweep(feedback_member, GRID, dt=DT, steps=STEPS, save_every=SAVE, layout="batch", chunk_size=4, progress=True)
    np.testing.assert_array_equal(np.asarray(chunked.status), np.asarray(sweeps["batch"].status))
    np.testing.assert_allclose(np.asarray(chunked.xs), np.asarray(sweeps["batch"].xs), atol=1e-13, equal_nan=True)


def test_sweep_under_jit_and_its_gradient_against_finite_differences():
    def member(gain):
        return geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains=gain), PENDULUM.x0

    def loss(gains, layout):
        result = geomjax.sweep(member, geomjax.zipped(gain=gains), dt=1e-2, steps=40, save_every=10, layout=layout)
        return jnp.mean(result.invariant_error[:, -1, 2])  # energy drift at the end

    gains = jnp.array([0.5, 2.0, 8.0])
    for layout in ("batch", "component"):
        grad = jax.grad(loss)(gains, layout)
        eps = 1e-6
        fd = np.array([(loss(gains.at[i].add(eps), layout) - loss(gains.at[i].add(-eps), layout)) / (2 * eps) for i in range(3)])
        np.testing.assert_allclose(np.asarray(grad), fd, rtol=1e-5)
    jitted = jax.jit(lambda k: loss(k, "batch"))
    np.testing.assert_allclose(float(jitted(gains)), float(loss(gains, "batch")), rtol=1e-14)


def test_save_load_and_heatmaps(sweeps, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    result = sweeps["batch"]
    result.save(tmp_path / "run")
    back = geomjax.SweepResult.load(tmp_path / "run")
    for name in ("xs", "status", "failed_step", "invariant_error", "constraint_error", "ts"):
        np.testing.assert_array_equal(np.asarray(getattr(back, name)), np.asarray(getattr(result, name)))
    assert back.grid.names == ("g", "gain") and back.summary() == result.summary()
    definition = json.loads((tmp_path / "run.json").read_text())
    assert definition["method"] == "euler" and definition["steps"] == STEPS and definition["dt"] == DT
    assert definition["swept"][1]["gain"] == [10.0, 100.0, 1e4] and definition["versions"]["jax"] == jax.__version__
    ax = result.heatmap("invariant_error")
    assert ax.get_xlabel() == "gain" and ax.get_ylabel() == "g"
    ax = result.heatmap("status", x="g", y="gain")
    labels = [t.get_text() for t in ax.figure.axes[-1].get_yticklabels()]
    assert labels == ["successful", "diverged"]


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="equal lengths"):
        geomjax.zipped(a=[1.0, 2.0], b=[1.0])
    with pytest.raises(TypeError, match="float64"):
        geomjax.product(g=np.array([1.0], np.float32))
    with pytest.raises(ValueError, match="more than one axis"):
        geomjax.product(geomjax.zipped(g=[1.0]), g=[2.0])
    with pytest.raises(TypeError, match="must return a pair"):
        geomjax.sweep(lambda g, gain: feedback_member(g, gain)[0], GRID, dt=DT, steps=10)
    with pytest.raises(TypeError, match="build.*could not be called with the swept names"):
        geomjax.sweep(lambda g: feedback_member(g, 1.0), GRID, dt=DT, steps=10)
    with pytest.raises(ValueError, match="layout"):
        geomjax.sweep(feedback_member, GRID, dt=DT, steps=10, layout="rows")
    with pytest.raises(ValueError, match="length 5"):
        geomjax.sweep(lambda g, gain: (feedback_member(g, gain)[0], jnp.ones(5)), GRID, dt=DT, steps=10)
    with pytest.raises(ValueError, match="unknown method"):
        geomjax.sweep(feedback_member, GRID, dt=DT, steps=10, method="rk5")


SHARDED = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + os.environ.get("XLA_FLAGS", "")
    import jax, numpy as np, geomjax
    assert len(jax.devices()) == 4
    def member(g, gain):
        model = geomjax.models.spherical_pendulum(g=g)
        return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0
    grid = geomjax.product(g=np.linspace(1.0, 10.0, 3), gain=[1.0, 30.0, 1e3, 1e4, 2e4])  # 15: padded to 16
    for layout in ("batch", "component"):
        one = geomjax.sweep(member, grid, dt=1e-3, steps=200, save_every=50, layout=layout)
        four = geomjax.sweep(member, grid, dt=1e-3, steps=200, save_every=50, layout=layout, devices=jax.devices())
        assert np.array_equal(np.asarray(one.status), np.asarray(four.status)), layout
        assert np.array_equal(np.asarray(one.failed_step), np.asarray(four.failed_step)), layout
        assert 0 < int(np.sum(np.asarray(one.status) != 0)) < 15, one.summary()
        np.testing.assert_allclose(np.asarray(four.xs), np.asarray(one.xs), atol=1e-13, rtol=0, equal_nan=True)
    print("sharded ok")
    """
)


@pytest.mark.extended
def test_sharded_sweep_on_four_cpu_devices_equals_one_device():
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sharded ok" in out.stdout


@pytest.mark.extended
def test_multi_process_sweep_with_jax_distributed_equals_one_process():
    """benchmarks/multihost_sweep.py: two local processes (jax.distributed, CPU collectives
    over gloo, two devices each) give the one-process sweep's statuses and states."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "multihost_sweep.py")
    out = subprocess.run([sys.executable, script, "--steps", "200"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "multi-process sweep equals the one-process sweep" in out.stdout
    assert "2 processes, 4 devices" in out.stdout


def test_final_is_a_deprecated_alias_of_x_final():
    import warnings

    result = geomjax.sweep(lambda g: (geomjax.dirac_field(geomjax.models.spherical_pendulum(g=g).system),
                                      geomjax.models.spherical_pendulum().x0), {"g": [1.0, 2.0]}, dt=0.01, steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = result.final
    assert any(issubclass(w.category, DeprecationWarning) and "x_final" in str(w.message) for w in caught)
    np.testing.assert_array_equal(np.asarray(old), np.asarray(result.x_final))
