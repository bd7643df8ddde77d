"""One way to tell known values from traced ones (`geomjax._validate`): `is_traced`,
`is_concrete`, `known`, `at_top_level`. Their private-JAX dependency lives there alone;
this test fails loudly when a JAX release moves it (geomjax would then count every value
under a transformation as traced: safe, but its eager checks would all move into the
compiled runs)."""

import ast
import pathlib

import jax
import jax.numpy as jnp

import geomjax
from geomjax import _validate
from geomjax._validate import at_top_level, is_concrete, is_traced, known


def test_the_private_jax_api_is_there():
    assert _validate._to_concrete_value is not None, "jax._src.core.to_concrete_value moved: update _validate"
    assert _validate._trace_ctx is not None, "jax._src.core.trace_ctx moved: update _validate"


def test_known_values_and_traced_ones():
    assert at_top_level() and float(known(jnp.asarray(2.0))) == 2.0
    seen = {}

    def probe(a):
        seen["top"], seen["known"], seen["traced"] = at_top_level(), known(a * 3.0), is_traced(a)
        return a

    jax.grad(probe)(1.0)  # eager grad: traced, but known
    assert seen == {"top": False, "known": 3.0, "traced": True}
    jax.jit(probe)(1.0)  # jit: traced and unknown
    assert seen["top"] is False and seen["known"] is None and seen["traced"]
    jax.vmap(probe)(jnp.ones(2))  # batched: unknown
    assert seen["known"] is None
    assert is_concrete({"a": jnp.ones(2), "b": 1.0})


def test_nothing_else_reads_private_jax_or_tests_for_tracers():
    """`jax._src` and `isinstance(..., Tracer)` appear in `_validate.py` only."""
    root = pathlib.Path(geomjax.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "_validate.py" and path.parent == root:
            continue
        text = path.read_text()
        if "jax._src" in text:
            offenders.append(f"{path.relative_to(root)}: jax._src")
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2
                    and "Tracer" in ast.unparse(node.args[1])):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: isinstance(…, Tracer)")
    assert not offenders, offenders


# --- the one mechanism for value checks: `_validate.check` --------------------------------
def _positive(x, **kw):
    return _validate.check(x, lambda xp, v: v <= 0, "x must be positive", detail=lambda v: f", got {v.tolist()}", **kw)


def test_check_raises_now_for_known_values_with_the_values_in_the_message():
    import numpy as np
    import pytest

    with pytest.raises(ValueError, match=r"x must be positive, got \[1.0, -2.0\]"):
        _positive(jnp.array([1.0, -2.0]))
    with pytest.raises(TypeError, match="x must be positive"):  # the error type is the caller's
        _validate.check(np.array(-1.0), lambda xp, v: v <= 0, "x must be positive", TypeError)
    # known under an eager transformation (its primal values): raised there too
    with pytest.raises(ValueError, match="x must be positive"):
        jax.grad(lambda a: (_positive(a), a)[1])(-1.0)
    assert _positive(jnp.array(2.0)) is None and _positive(jnp.array(2.0), guard=3) == 3


def test_check_evaluates_what_it_can_at_trace_time_inside_jit():
    """Values computed (by a callable) from constants are known inside an enclosing jit:
    the check raises at trace time, not when the program runs."""
    import pytest

    constant = jnp.array([1.0, -2.0])
    with pytest.raises(ValueError, match="x must be positive"):
        jax.jit(lambda y: (_positive(lambda: constant * 2.0), y)[1])(1.0)
    # computed by hand inside jit the value is staged, so unknown: left to the run
    assert jax.jit(lambda y: (_positive(constant * y) is None, y)[1])(1.0) == 1.0


def test_check_on_traced_values_errs_at_run_time_or_hands_back_the_predicate():
    import equinox as eqx
    import pytest

    run = eqx.filter_jit(lambda x: _positive(x, guard=x))
    assert run(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    with pytest.raises(eqx.EquinoxRuntimeError, match="x must be positive"):
        jax.block_until_ready(run(jnp.array([1.0, -2.0])))
    with pytest.raises(Exception, match="x must be positive"):  # jax.jit wraps it in its runtime error
        jax.block_until_ready(jax.jit(lambda x: _positive(x, guard=x))(jnp.array([-1.0])))
    bad = jax.jit(lambda x: _positive(x, status=True))
    assert bool(bad(jnp.array([1.0, -2.0]))) and not bool(bad(jnp.array([1.0, 2.0])))
    # under vmap: the predicate is per row
    rows = jax.vmap(lambda x: _positive(x, status=True))(jnp.array([[1.0], [-1.0]]))
    assert rows.tolist() == [False, True]


def test_checks_use_the_one_mechanism():
    """No check in geomjax decides on `is_concrete` and then reads values with NumPy: value
    checks go through `_validate.check` (host decisions read `known`)."""
    root = pathlib.Path(geomjax.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.If):
                continue
            # `if is_concrete(x): … raise` reads values to check them (a `not is_concrete`
            # test is a host-side decision that needs values, not a value check)
            positive = [c for c in ast.walk(node.test) if isinstance(c, ast.Call) and ast.unparse(c.func) == "is_concrete"]
            negated = [n.operand for n in ast.walk(node.test) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)]
            if any(all(c is not o for o in negated) for c in positive):
                if any(isinstance(n, ast.Raise) for n in ast.walk(node)):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"checks outside _validate.check: {offenders}"


def test_nothing_asks_jax_errors_whether_a_value_is_known():
    """"Is this value known now?" is answered by `known` alone, never by catching JAX's
    tracer-conversion errors around a check. The only catches of those errors left turn a
    user function that JAX cannot trace into a message (`_validate._TRACE_ERRORS`, with
    `untraceable_message`)."""
    root = pathlib.Path(geomjax.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = ast.unparse(node.type)
                if "Tracer" in caught or "Concretization" in caught or "TRACED" in caught:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno} catches {caught}")
    assert not offenders, offenders
    import geomjax._validate as validate

    assert not hasattr(validate, "checked_where_known") and not hasattr(validate, "TRACED_VALUE_ERRORS")


def test_a_start_check_needing_a_traced_closed_over_value_leaves_it_to_the_run():
    """RATTLE's start check inside `jit` with the constraint's radius closed over from the
    trace: the check's values are not known, so it does not run (no tracer error), and the
    run still reports a start off its constraint set at step 0."""
    model = geomjax.models.spherical_pendulum()

    def final(r):
        system = geomjax.System(model.system.hamiltonian, geomjax.canonical(3), holonomic=lambda q: q @ q - r * r)
        sol = geomjax.integrate(geomjax.rattle(system), model.x0, dt=0.01, steps=3, throw=False)
        return sol.xs[-1], sol.status

    from geomjax._status import code_int

    _, status = jax.jit(final)(1.0)
    assert int(status) == 0
    _, status = jax.jit(final)(1.5)  # x0 lies on the unit sphere, not on |q| = 1.5
    assert int(status) == code_int(geomjax.RESULTS.off_constraint_set)
