"""The component layout carries one (B,) array per scalar of the state.

Checks: the per-step loops of a component-major sweep carry the state as (B,) float
leaves (read off the jaxpr of the compiled chunk, where the pieces layout carries (n, B)
arrays); the rows, pieces and batch layouts agree to 1e-13 with members failing (a
diverging explicit step, a failed Newton solve, a start off the constraint set); what
"auto" picks for each benchmark problem on a GPU; the `Rows` conversions.
"""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

import geomjax
from geomjax._driver import batched, loop_choice
from geomjax._driver.batched import Rows
from geomjax._driver.loop_choice import auto_loop
from geomjax._driver.common import RunOptions
from geomjax._driver.sweep import _one_step_profile, _sweep_chunk

from geomjax._step.methods import build_step

# two save blocks of four steps, unrolled 8, monitored (as a sweep runs a chunk)
_RUN = RunOptions(save_every=4, blocks=2, checkpoint=True, unroll=8, start_tol=1e-6, drift_tol=1e-2, monitored=True)
PENDULUM = geomjax.models.spherical_pendulum()
HOLONOMIC = geomjax.models.spherical_pendulum(holonomic=True)
KW = dict(dt=0.01, steps=12, save_every=4)


def feedback_member(gain):
    return geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains=gain), PENDULUM.x0


def rattle_member(scale):
    # momenta ×300: RATTLE's Newton solve fails at the first step; ×1e3 in position: off the sphere
    x0 = HOLONOMIC.x0.at[3:].multiply(jnp.minimum(scale, 300.0)).at[:3].multiply(jnp.where(scale > 500.0, 2.0, 1.0))
    return geomjax.rattle(HOLONOMIC.system), x0


# (build, grid, method): each with a member that succeeds and members that fail
CASES = {
    # gain 1e3 at dt = 0.01 is past explicit Euler's (and RK4's) stability limit
    "euler": (feedback_member, {"gain": [1.0, 20.0, 1e3]}, "euler"),
    "rk4": (feedback_member, {"gain": [1.0, 20.0, 1e4]}, "rk4"),
    # gain 1e7: Gauss' Newton solve does not converge
    "gauss2": (feedback_member, {"gain": [1.0, 20.0, 1e7]}, "gauss2"),
    "rattle": (rattle_member, {"scale": [1.0, 300.0, 1e3]}, None),
}


def _sweep(case, layout):
    build, grid, method = CASES[case]
    method = {} if method is None else {"method": method}
    return geomjax.sweep(build, geomjax.zipped(**grid), layout=layout, **KW, **method)


# (the rows layout against vmap of integrate, for every kind of step: tests/test_sweep.py)
@pytest.mark.parametrize(
    "case", ["euler", "rattle", *[pytest.param(c, marks=pytest.mark.extended) for c in ("gauss2", "rk4")]]
)
def test_rows_pieces_and_batch_layouts_agree_with_failing_members(case):
    results = {layout: _sweep(case, layout) for layout in ("component", "component-pieces", "batch")}
    rows = results["component"]
    status = np.asarray(rows.status)
    assert (status == 0).any() and (status != 0).any(), status  # some members fail, some do not
    for layout, other in results.items():
        np.testing.assert_array_equal(np.asarray(other.status), status, err_msg=layout)
        np.testing.assert_array_equal(np.asarray(other.failed_step), np.asarray(rows.failed_step), err_msg=layout)
        # NaN saves after a failure sit at the same places (assert_allclose compares NaN as equal)
        np.testing.assert_allclose(np.asarray(other.xs), np.asarray(rows.xs), rtol=0, atol=1e-13, err_msg=layout)


def _scan_carries(jaxpr, out):
    """The carried avals of every `scan` in `jaxpr`, nested ones included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            start = eqn.params["num_consts"]
            out.append([v.aval for v in eqn.invars[start : start + eqn.params["num_carry"]]])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, (ClosedJaxpr, Jaxpr)):
                    _scan_carries(getattr(sub, "jaxpr", sub), out)
    return out


@pytest.mark.parametrize("method", ["euler", "gauss2"])
def test_the_component_layout_loops_carry_one_row_per_scalar(method):
    """Every loop over steps (the fast loop, the checked recomputation of a failed block,
    the loop over save blocks) carries the state as (B,) float arrays in the component
    layout, and as (3, B) pieces in the pieces layout (so the check can fail)."""
    size = 5
    members = {"gain": jnp.linspace(1.0, 5.0, size)}
    dt, t0 = jnp.float64(0.01), jnp.float64(0.0)

    def carried(layout):
        chunk = lambda m: _sweep_chunk(feedback_member, m, (dt, t0, None), (method, False, layout, size), _RUN)
        carries = _scan_carries(jax.make_jaxpr(chunk)(members).jaxpr, [])
        assert len(carries) >= 3
        return [a.shape for carry in carries for a in carry if jnp.issubdtype(a.dtype, jnp.floating)]

    rows = carried("component")
    assert rows and set(rows) == {(size,)}, rows
    assert (3, size) in carried("component-pieces")


def _scan_bodies(jaxpr, out):
    """The body jaxprs of every `scan` in `jaxpr`, nested ones included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append(eqn.params["jaxpr"].jaxpr)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, (ClosedJaxpr, Jaxpr)):
                    _scan_bodies(getattr(sub, "jaxpr", sub), out)
    return out


def test_the_rows_step_computes_on_rows_only():
    """Inside the fast loop of a component sweep, a member's step is one scalar graph
    under `vmap`: every value it hands back is a (B,) row, none a slice of stacked (n, B)
    pieces (XLA on a GPU copied such slices back into the loop's rows every step and split
    the step into several kernels: 8.5e9 against 5.9e10 trajectory-steps/s on an H100)."""
    size = 5
    members = {"gain": jnp.linspace(1.0, 5.0, size)}
    dt, t0 = jnp.float64(0.01), jnp.float64(0.0)
    chunk = lambda m: _sweep_chunk(feedback_member, m, (dt, t0, None), ("euler", False, "component", size), _RUN)
    bodies = _scan_bodies(jax.make_jaxpr(chunk)(members).jaxpr, [])
    stepping = [b for b in bodies if any(e.primitive.name == "custom_jvp_call" for e in b.eqns)]

    def on_rows(body):
        for eqn in body.eqns:
            if eqn.primitive.name in ("concatenate", "stack", "slice", "gather", "dynamic_slice"):
                return False
            for v in eqn.outvars:
                if jnp.issubdtype(v.aval.dtype, jnp.floating) and v.aval.shape:
                    if v.aval.shape[-1] != size or max(v.aval.shape[:-1], default=1) != 1:
                        return False
        return True

    # the fast loop (the checked recomputation and the save blocks restack, off the hot path)
    assert len(stepping) == 3 and sum(map(on_rows, stepping)) == 1, [len(b.eqns) for b in stepping]


def _profile(build, x0, method):
    target, x0 = build(x0)
    step = build_step(method, target) if method else target
    return _one_step_profile(step, jnp.asarray(x0), jnp.float64(1e-3), jnp.float64(0.0), None)


def test_auto_picks_per_step_what_was_measured_fastest_on_the_gpu():
    """On a GPU: rows for every step, with 8 steps per iteration for the feedback Euler
    of the pendulum and of the knife edge (its sin and cos included), 4 for Heun, 1 for
    RK4 and RATTLE."""
    knife = geomjax.models.knife_edge()
    cases = {
        "pendulum euler": ((feedback_member, 10.0, "euler"), ("component", 8)),
        "pendulum heun": ((feedback_member, 10.0, "heun"), ("component", 4)),
        "pendulum rk4": ((feedback_member, 10.0, "rk4"), ("component", 1)),
        "rattle": ((rattle_member, 1.0, None), ("component", 1)),
        "knife euler": ((lambda g: (geomjax.feedback_field(knife.system, knife.x0, gains=g), knife.x0), 10.0, "euler"),
                        ("component", 8)),
    }
    for name, ((build, value, method), expected) in cases.items():
        constant, profile = _profile(build, value, method)
        assert auto_loop("gpu", constant, profile) == expected, (name, profile)
        assert auto_loop("cpu", constant, profile) == ("batch", 1), name
    constant, profile = _profile(*cases["knife euler"][0])
    assert profile["transcendental"] == 2  # one sin and one cos of the angle, shared by the graph


def test_rows_restack_to_the_pieces_layout_and_the_module_examples():
    """A component-major state split into rows and restacked equals the pieces layout's."""
    members = {"gain": jnp.linspace(1.0, 5.0, 4)}
    make = lambda m: feedback_member(m["gain"])
    rows_step, x0 = batched.batch_members(make, members, -1, 4, rows=True)
    pieces_step, _ = batched.batch_members(make, members, -1, 4, rows=False)
    rows = rows_step.split(x0)
    assert isinstance(rows, Rows) and len(rows.rows) == 6 and all(r.shape == (4,) for r in rows.rows)
    for a, b in zip(rows.to_pieces(), pieces_step.split(x0)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(rows_step.merge(rows), x0)
    for module in (batched, loop_choice):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_rows_in_chunks_and_long_runs_equal_one_program():
    """The component layout in chunks of members and through the driver's chunks of
    steps (a progress bar) gives the one-program result, statuses included."""
    build, grid, _ = CASES["euler"]
    kw = dict(dt=0.01, steps=12, save_every=4, method="euler", layout="component")
    whole = geomjax.sweep(build, geomjax.zipped(**grid), **kw)
    parts = geomjax.sweep(build, geomjax.zipped(**grid), chunk_size=2, progress="rows", **kw)
    np.testing.assert_array_equal(np.asarray(parts.status), np.asarray(whole.status))
    np.testing.assert_array_equal(np.asarray(parts.failed_step), np.asarray(whole.failed_step))
    np.testing.assert_allclose(np.asarray(parts.xs), np.asarray(whole.xs), rtol=0, atol=1e-13)


def test_the_library_ships_no_pallas_kernel():
    """The sweep runs one loop, a `lax.scan` (docs/howto/sweeps.md, "No Pallas loop"). A Pallas kernel
    added later needs a CPU test of its Triton lowering (`jax.export` for
    `platforms=["cuda"]` with `pallas.triton.CompilerParams`) beside this one."""
    import pathlib

    sources = pathlib.Path(geomjax.__file__).parent.rglob("*.py")
    assert not [p.name for p in sources if "pallas" in p.read_text()]
