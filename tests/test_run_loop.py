"""The driver's run loop (`geomjax._driver.integrate._fast_steps`): one copy of the step in
the compiled run, and the same states and statuses as the checked step-by-step loop
(`_exact_steps`) where a save block fails — at which step, with which cause, with a step
whose fast variant fails where the step itself recovers, under `jit` and `vmap`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import RESULTS
from geomjax._driver import integrate as driver
from geomjax._driver.loop_choice import step_profile
from geomjax._step.base import AbstractStep

BLOCK = 12
NEWTON_FAILED = int(RESULTS.newton_failed._value)


def _sines(fn, *args) -> int:
    return step_profile(fn, *args)["transcendental"]


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_the_run_holds_one_copy_of_the_step(method):
    """A run saved every 10 steps holds as many `sin` of the field x ↦ −sin x in its
    program as a run of one step (one loop with the step, once), alone and under vmap;
    a run loop compiled twice (a fast loop and a re-run of failed blocks) holds twice as
    many. A differentiated run adds the checked loop that defines the derivatives."""
    field = lambda x: -jnp.sin(x)  # noqa: E731
    kw = dict(dt=0.1, method=method, throw=False)
    run = lambda x: geomjax.integrate(field, x, steps=40, save_every=10, **kw).xs  # noqa: E731
    x0 = jnp.array([0.5, 1.0])
    per_step = _sines(lambda x: geomjax.integrate(field, x, steps=1, **kw).xs, x0)
    assert per_step >= 1 and _sines(run, x0) == per_step
    assert _sines(jax.vmap(run), jnp.stack([x0, 2 * x0])) == per_step
    assert _sines(jax.grad(lambda x: run(x)[-1, 0]), x0) > per_step


class _Flaky(AbstractStep):
    """x ↦ x + h·cos x on a scalar state, failing (`newton_failed`) in the steps that start
    at the times `fails` (for `fast=True`, the fast variant, also at `fast_fails`), and
    giving inf from the step that starts at `blows_up` on."""

    fails: jax.Array
    fast_fails: jax.Array
    blows_up: jax.Array
    fast: bool = False

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def advance(self, t, z, h, args):
        hit = lambda times: jnp.any(jnp.abs(times - t) < 0.25 * h)  # noqa: E731
        bad = hit(self.fails) | (self.fast & hit(self.fast_fails))
        z_next = jnp.where(t >= self.blows_up - 0.25 * h, jnp.inf, z + h * jnp.cos(z))
        return z_next, RESULTS.where(bad, RESULTS.newton_failed, RESULTS.successful)

    def fast_variant(self):
        return self if self.fast else _Flaky(self.fails, self.fast_fails, self.blows_up, True)


def _block(kind, step, z, record):
    if kind == "fast":
        return driver._fast_steps(step, jnp.asarray(1.0), jnp.asarray(0.0), None, BLOCK)(z, record)
    return driver._exact_steps(step, jnp.asarray(1.0), jnp.asarray(0.0), None, BLOCK, False)(z, record)


# Members: (times its step fails, times only its fast variant fails, blow-up time, status before)
_MEMBERS = [
    ([100.0], [100.0], 100.0, 0),  # no failure
    ([7.0], [100.0], 100.0, 0),  # the step fails: step 8 (t = 7), newton_failed
    ([100.0], [3.0, 9.0], 100.0, 0),  # only the fast variant fails: recovered, no failure
    ([10.0], [4.0], 100.0, 0),  # fast variant recovered at step 5, the step fails at 11
    ([100.0], [2.0], 6.0, 0),  # recovered at step 3, diverged at step 7
    ([100.0], [100.0], 0.0, 0),  # non-finite at the first step
    ([5.0], [100.0], 100.0, NEWTON_FAILED),  # failed in an earlier block: frozen
]


@pytest.fixture(scope="module")
def members():
    fails = jnp.array([m[0] + [100.0] * (2 - len(m[0])) for m in _MEMBERS])
    fast_fails = jnp.array([m[1] + [100.0] * (2 - len(m[1])) for m in _MEMBERS])
    blows_up = jnp.array([m[2] for m in _MEMBERS])
    records = jnp.array([[0, -1 if m[3] == 0 else 3, m[3]] for m in _MEMBERS], jnp.int64)
    return fails, fast_fails, blows_up, records


def test_a_failed_block_gives_the_checked_loops_states_and_statuses(members):
    """Block by block, alone (each member) and as one vmap: the same end state (bitwise)
    and record (steps, failing step, cause) as the checked loop of the step itself."""
    fails, fast_fails, blows_up, records = members
    z0 = jnp.full(len(_MEMBERS), 0.3)

    def both(f, ff, b, z, record):
        step = _Flaky(f, ff, b)
        return _block("fast", step, z, record), _block("exact", step, z, record)

    batched = jax.jit(jax.vmap(both))(fails, fast_fails, blows_up, z0, records)
    one = jax.jit(both)
    for i in range(len(_MEMBERS)):
        (z, rec), (z_ref, rec_ref) = one(fails[i], fast_fails[i], blows_up[i], z0[i], records[i])
        np.testing.assert_array_equal(np.asarray(rec), np.asarray(rec_ref), err_msg=str(i))
        np.testing.assert_array_equal(np.asarray(z), np.asarray(z_ref), err_msg=str(i))
        for out, ref in zip(batched[0], (z, rec)):
            np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(ref), err_msg=str(i))
    _, rec = batched[0]
    assert np.asarray(rec[:, 1]).tolist() == [-1, 8, -1, 11, 7, 1, 3]
    names = [RESULTS._index_to_message[int(c)] for c in np.asarray(rec[:, 2])]
    assert [n == RESULTS._index_to_message[0] for n in names] == [True, False, True, False, False, False, False]
    assert np.asarray(rec[:, 2])[[1, 3, 6]].tolist() == [NEWTON_FAILED] * 3
    assert np.asarray(rec[:, 2])[4] == int(RESULTS.diverged._value)
    assert np.asarray(rec[:, 2])[5] == int(RESULTS.nonfinite_first_step._value)
    assert np.all(np.asarray(rec[:, 0]) == BLOCK)


def _halve(x, h):
    return x * (1.0 - h)


def test_a_direct_call_builds_its_step_once_and_shares_its_program():
    """Outside jit, `integrate` builds a method's step once per field (and a method
    registered anew under the same name is used), equal steps made anew share one
    compiled program, and the results are those of the same run inside jit."""
    from geomjax._driver import common
    from geomjax._step.runge_kutta import EULER, HEUN, explicit_rk

    field = geomjax.TimeField(lambda t, x, args: -x)
    x0 = jnp.array([1.0])
    kw = dict(dt=0.1, steps=4, save_every=2)
    direct = geomjax.integrate(field, x0, method="euler", **kw)
    step = driver._step_for("euler", field)
    assert driver._step_for("euler", field) is step
    inside = jax.jit(lambda x: geomjax.integrate(field, x, method="euler", **kw).xs)(x0)
    np.testing.assert_array_equal(np.asarray(direct.xs), np.asarray(inside))
    np.testing.assert_allclose(np.asarray(direct.xs[:, 0]), [1.0, 0.81, 0.6561])
    geomjax.register_method("run_loop_test", lambda f: explicit_rk(f, EULER), 1)
    euler = geomjax.integrate(field, x0, method="run_loop_test", **kw)
    geomjax.register_method("run_loop_test", lambda f: explicit_rk(f, HEUN), 2)
    heun = geomjax.integrate(field, x0, method="run_loop_test", **kw)
    np.testing.assert_array_equal(np.asarray(euler.xs), np.asarray(direct.xs))
    np.testing.assert_allclose(np.asarray(heun.xs[1, 0]), (1 - 0.1 + 0.005) ** 2)
    before = common._compiled_on._cache_size()
    runs = [geomjax.integrate(geomjax.FunctionStep(_halve), x0, **kw) for _ in range(3)]
    assert common._compiled_on._cache_size() == before + 1
    np.testing.assert_allclose(np.asarray(runs[-1].xs[:, 0]), [1.0, 0.81, 0.6561])
