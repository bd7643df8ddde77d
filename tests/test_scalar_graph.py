"""The simplified scalar expression graph that derived fields are evaluated through.

Every derived field (`rhs`) must equal the field as derived (`vector`, no simplification)
for every shipped model, at random states on and off the constraint sets; the rules must
remove what they claim to remove; gradients, `vmap` and the fallback for what the
expansion does not know must all give the same numbers as the function itself.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import geomjax
from geomjax import models
from geomjax.internal import simplify
from geomjax.internal.simplify import MAX_INPUTS, scalar_graph

FEEDBACK_MODELS = {
    "spherical_pendulum": models.spherical_pendulum,
    "spherical_pendulum_holonomic": lambda: models.spherical_pendulum(holonomic=True),
    "planar_pendulum": models.planar_pendulum,
    "knife_edge": models.knife_edge,
    "chaplygin_sleigh": models.chaplygin_sleigh,
    "vertical_disk": models.vertical_disk,
    "roller_racer": models.roller_racer,
    "heisenberg": models.heisenberg,
    "nonholonomic_oscillator": models.nonholonomic_oscillator,
    "suslov": models.suslov,
    "suslov_reduced": lambda: models.suslov(reduced=True),
}


def _fields(model):
    system = model.system
    out = [geomjax.feedback_field(system, model.x0, gains=3.0)]
    if system.nonholonomic is not None:
        out.append(geomjax.nonholonomic_field(system))
    else:
        out.append(geomjax.dirac_field(system))
    return out


def _arith_count(fn, *args):
    """Scalar arithmetic operations in the jaxpr of `fn` (calls inlined): each equation
    counts its output size, a contraction its output size times the contracted length."""
    names = {"add", "add_any", "sub", "mul", "div", "neg", "integer_pow", "dot_general", "reduce_sum"}

    def size(eqn):
        out = int(np.prod(eqn.outvars[0].aval.shape))
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            out *= int(np.prod([eqn.invars[0].aval.shape[d] for d in lhs_contract]))
        elif eqn.primitive.name == "reduce_sum":
            out = int(np.prod(eqn.invars[0].aval.shape))
        return out

    def count(jaxpr):
        total = 0
        for eqn in jaxpr.eqns:
            total += size(eqn) if eqn.primitive.name in names else 0
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                total += count(sub)
        return total

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


# the two largest nonholonomic fields (3-4 s each) in CI's extended job; the others in
# the default run go through the same simplification of a nonholonomic feedback field
_EXTENDED_MODELS = {"vertical_disk", "roller_racer"}


@pytest.mark.parametrize(
    "name", [n if n not in _EXTENDED_MODELS else pytest.param(n, marks=pytest.mark.extended) for n in sorted(FEEDBACK_MODELS)]
)
def test_simplified_fields_equal_the_fields_as_derived(name, rng):
    model = FEEDBACK_MODELS[name]()
    x0 = np.asarray(model.x0)
    xs = jnp.asarray(x0 + 0.3 * rng.standard_normal((4, x0.shape[0])))
    for field in _fields(model):

        @jax.jit
        def both(xs, field=field):
            def one(x):
                z = field.split(x)
                return field.merge(field.rhs(0.0, z, None)), field.merge(field.vector(z))

            return jax.vmap(one)(xs)

        simplified, derived = both(xs)
        scale = 1.0 + float(jnp.max(jnp.abs(derived)))
        np.testing.assert_allclose(simplified, derived, rtol=0, atol=1e-13 * scale, err_msg=f"{name}: {type(field).__name__}")


def test_the_spherical_pendulum_feedback_field_loses_the_structural_zeros(spherical):
    y = geomjax.feedback_field(spherical.system, spherical.x0, gains=50.0)
    z = y.split(spherical.x0)
    derived = _arith_count(y.vector, z)
    simplified = _arith_count(lambda w: y.rhs(0.0, w, None), z)
    # A hand derivation (seed 000 eqs. (7)–(8)) needs about 100 scalar operations; the
    # autodiff derivation as traced has several times that in vector operations. The
    # graph keeps 87, and the finiteness guard adds 11 (3 checks, their sum, 6 outputs).
    assert simplified <= 100, simplified
    assert simplified < derived
    jaxpr = jax.make_jaxpr(lambda w: y.rhs(0.0, w, None))(z).jaxpr
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "mul":
            for v in eqn.invars:
                if isinstance(v, jax.extend.core.Literal):
                    assert float(v.val) not in (0.0, 1.0, -1.0), eqn


def _emitted(fn, *args):
    """The primitives `scalar_graph(fn, ...)` evaluates (inside its `custom_jvp`, whose rule
    is the simplified JVP)."""

    def names(jaxpr):
        out = []
        for e in jaxpr.eqns:
            if e.primitive.name == "custom_jvp_call":
                out += names(e.params["call_jaxpr"].jaxpr)
            else:
                out.append(e.primitive.name)
        return out

    return names(jax.make_jaxpr(lambda *a: scalar_graph(fn, *a))(*args).jaxpr)


def test_algebraic_rules():
    x = jnp.array([0.3, -1.2, 2.0])
    # ∇(½ x·x) by reverse mode is ½x + ½x: the graph returns x itself, with no arithmetic
    ops = _emitted(jax.grad(lambda v: 0.5 * v @ v), x)
    assert not {"mul", "add", "add_any"} & set(ops), ops
    # sin²θ + cos²θ = 1 and x·0 = 0 (what is left is the finiteness guard on θ and x[1])
    ops = _emitted(lambda v: jnp.sin(v[0]) ** 2 + jnp.cos(v[0]) ** 2 + 0.0 * v[1], x)
    assert not {"sin", "cos", "mul"} & set(ops), ops
    assert ops.count("sub") == 2, ops
    # (a − b) + (b − a) = 0, 3a − 3b = 3(a − b), a(2b) + (2a)b = 4ab
    np.testing.assert_array_equal(scalar_graph(lambda v: (v[0] - v[1]) + (v[1] - v[0]), x), 0.0)
    ops = _emitted(lambda v: 3.0 * v[0] - 3.0 * v[1], x)
    assert ops.count("mul") == 1 and ops.count("sub") == 1, ops
    ops = _emitted(lambda v: v[0] * (2.0 * v[1]) + (2.0 * v[0]) * v[1], x)
    assert ops.count("mul") == 2 and "add" not in ops, ops
    np.testing.assert_allclose(scalar_graph(lambda v: v[0] * (2.0 * v[1]) + (2.0 * v[0]) * v[1], x), 4 * 0.3 * -1.2)


def test_values_gradients_and_vmap_match_the_function(rng):
    def fn(q, p):
        r = jnp.sqrt(q @ q)
        m = jnp.stack([q, p])
        return {
            "a": jnp.where(q > 0, q * p, -p) / r,
            "b": jnp.sum(m @ m.T) + jnp.exp(-p[0]) * jnp.arctan2(q[1], q[2]),
            "c": jnp.concatenate([jnp.ones(2), jnp.flip(q) ** 3, jnp.pad(p[:2], (1, 0))]),
        }

    q, p = jnp.asarray(rng.standard_normal(3)), jnp.asarray(rng.standard_normal(3))
    assert "while" not in _emitted(fn, q, p) and "dot_general" not in _emitted(fn, q, p)
    ref, got = fn(q, p), scalar_graph(fn, q, p)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-14, atol=1e-14)

    def loss(fun, q, p):
        out = fun(q, p)
        return jnp.sum(out["a"] ** 2) + out["b"] + jnp.sum(out["c"])

    g_ref = jax.grad(loss, argnums=(1, 2))(fn, q, p)
    g_got = jax.grad(lambda q, p: loss(lambda a, b: scalar_graph(fn, a, b), q, p), argnums=(0, 1))(q, p)
    for a, b in zip(g_got, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    qs = jnp.asarray(rng.standard_normal((5, 3)))
    batched = jax.jit(jax.vmap(lambda a: scalar_graph(fn, a, p)["b"]))(qs)
    np.testing.assert_allclose(batched, jax.vmap(lambda a: fn(a, p)["b"])(qs), rtol=1e-14)


def test_traced_parameters_stay_inputs(rng):
    """A parameter closed over under jit/grad is an input of the graph, not a constant."""
    x = jnp.asarray(rng.standard_normal(3))

    def f(k):
        return scalar_graph(lambda v: k * v * 0.0 + k * v[0] * v, x)

    np.testing.assert_allclose(jax.grad(lambda k: jnp.sum(f(k)))(2.0), jnp.sum(x[0] * x))
    np.testing.assert_allclose(jax.jit(f)(2.0), 2.0 * x[0] * x)


def test_traced_values_closed_over_count_as_inputs(rng):
    """A network's weights under `jax.grad` are inputs of the graph: past MAX_INPUTS of
    them (with the arguments) the function is evaluated unchanged, not expanded weight by
    weight (a 2×16 network's training step compiled 8× slower that way); a few stay
    inputs of an expanded graph. Values and gradients are the function's either way."""
    x = jnp.asarray(rng.standard_normal(3))
    big = jnp.asarray(rng.standard_normal((MAX_INPUTS, 3)))

    def energy(w, v):
        return jnp.sum(jnp.tanh(w @ v) ** 2) + 0.0 * v[0]

    def expanded(w):
        simplify.clear_cache()
        jaxpr = jax.make_jaxpr(lambda w: scalar_graph(lambda v: energy(w, v), x))(w)
        return any(e.primitive.name == "custom_jvp_call" for e in jaxpr.jaxpr.eqns), jaxpr

    small_expanded, _ = expanded(big[:4])
    big_expanded, jaxpr = expanded(big)
    assert small_expanded and not big_expanded
    assert "dot_general" in {e.primitive.name for e in jaxpr.jaxpr.eqns}  # the product as written
    value = lambda w: scalar_graph(lambda v: energy(w, v), x)
    for w in (big[:4], big):
        np.testing.assert_allclose(jax.jit(value)(w), energy(w, x), rtol=1e-14)
        np.testing.assert_allclose(jax.jit(jax.grad(value))(w), jax.grad(energy)(w, x), rtol=1e-12, atol=1e-15)


def test_operations_without_a_rule_are_kept_whole_and_large_inputs_fall_back(rng):
    x = jnp.asarray(rng.standard_normal(4))

    def with_loop(v):
        return lax.fori_loop(0, 3, lambda i, a: a * v, v) + 0.0 * v

    np.testing.assert_allclose(scalar_graph(with_loop, x), with_loop(x))  # concrete: folded
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kept whole: no fallback, no warning
        ops = _emitted(with_loop, x)
        assert {"while", "scan"} & set(ops) and "mul" not in ops[: ops.index("scan" if "scan" in ops else "while")]
        np.testing.assert_allclose(jax.jit(lambda v: scalar_graph(with_loop, v))(x), with_loop(x))
        np.testing.assert_allclose(jax.jacfwd(lambda v: scalar_graph(with_loop, v))(x), jax.jacfwd(with_loop)(x))
    big = jnp.asarray(rng.standard_normal(MAX_INPUTS + 1))
    ops = _emitted(lambda v: 0.0 * v + v, big)
    assert "mul" in ops  # evaluated unchanged


def test_several_constraints_expand_through_the_pivoting_solve(rng):
    """Two holonomic constraints give a 4×4 C, solved by unrolled elimination with partial
    pivoting (argmax and selects); the graph expands it and keeps the values."""
    n = 4
    mass = jnp.asarray(np.eye(n) + 0.2 * np.ones((n, n)))
    inverse_mass = jnp.linalg.inv(mass)
    system = geomjax.System(
        lambda x: 0.5 * x[n:] @ (inverse_mass @ x[n:]) + jnp.sum(jnp.cos(x[:n])),
        geomjax.canonical(n),
        holonomic=lambda q: jnp.stack([q[0] ** 2 + q[1] ** 2 - 1.0, q[2] ** 2 + q[3] ** 2 - 1.0]),
    )
    field = geomjax.dirac_field(system)
    x = jnp.asarray(np.concatenate([[0.6, 0.8, 0.8, -0.6], 0.1 * rng.standard_normal(n)]) + 0.05 * rng.standard_normal(2 * n))
    z = field.split(x)
    np.testing.assert_allclose(field.merge(field.rhs(0.0, z, None)), field.merge(field.vector(z)), rtol=1e-12, atol=1e-13)
    ops = _emitted(field.vector, z)
    assert "argmax" not in ops and "gt" in ops and "select_n" in ops, set(ops)


def test_the_pass_is_what_removes_the_operations(spherical):
    """Fails with the pass off: the lowered spherical-pendulum feedback field has the
    few scalar multiplications of the simplified graph only when simplification ran."""
    y = geomjax.feedback_field(spherical.system, spherical.x0, gains=50.0)
    z = y.split(spherical.x0)

    def counts(y):
        text = jax.jit(lambda z: y.rhs(0.0, z, None)).lower(z).as_text()
        return text.count("stablehlo.multiply"), text.count("stablehlo.dot_general") + text.count("stablehlo.reduce")

    on_mul, on_vector = counts(y)
    off_mul, off_vector = counts(simplify.unsimplified(y))
    assert on_vector == 0 and on_mul <= 55, (on_mul, on_vector)
    assert off_vector > 0 or off_mul > 55, (off_mul, off_vector)  # the same bound fails unsimplified


MASS = np.eye(3) + 0.2 * np.ones((3, 3))
USER_FUNCTIONS = {
    "eye": lambda x: 0.5 * x @ (jnp.eye(3) * 2.0) @ x + x[0],
    "identity": lambda x: jnp.identity(3) @ x * x[1],
    "diag": lambda x: jnp.diag(x) @ x + jnp.diag(jnp.diag(x) * 2.0),
    "arange": lambda x: jnp.arange(3.0) * x + jnp.where(jnp.arange(3) > 0, x, -x),
    "softplus": lambda x: jax.nn.softplus(x) * x[0],
    "stop_gradient": lambda x: lax.stop_gradient(x) * x + x[0] ** 2 - lax.stop_gradient(x[1]),
    "inv": lambda x: 0.5 * x @ jnp.linalg.inv(jnp.asarray(MASS)) @ x,
    "gather": lambda x: x[jnp.array([2, 0, 1])] * x,
    "cumsum": lambda x: jnp.cumsum(x) * jnp.cumprod(x),
    "dynamic_slice": lambda x: lax.dynamic_slice(x, (1,), (2,)) * x[0],
}


@pytest.mark.parametrize("name", sorted(USER_FUNCTIONS))
def test_ordinary_user_code_expands_with_the_same_values_and_gradients(name, rng):
    fn = USER_FUNCTIONS[name]
    x = jnp.asarray(rng.standard_normal(3))
    simplified = lambda v: scalar_graph(fn, v)
    loss = lambda f: lambda v: jnp.sum(jnp.sin(f(v)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these may fall back
        value, grad = jax.jit(simplified)(x), jax.jit(jax.grad(loss(simplified)))(x)
        ops = _emitted(fn, x)
    np.testing.assert_allclose(value, fn(x), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(grad, jax.grad(loss(fn))(x), rtol=1e-12, atol=1e-14)
    assert not {"dot_general", "gather", "cumsum", "lu", "custom_linear_solve", "iota"} & set(ops), ops


def test_user_code_in_a_system_runs_simplified(rng):
    """A mass-matrix Hamiltonian through the public API: no crash, no fallback."""
    n = 2
    mass = jnp.asarray(np.eye(n) * 2.0 + 0.1)
    system = geomjax.System(
        lambda x: 0.5 * x[n:] @ jnp.linalg.inv(mass) @ x[n:] + 0.5 * x[:n] @ (jnp.eye(n) * 3.0) @ x[:n],
        geomjax.canonical(n),
    )
    field = geomjax.dirac_field(system)
    x = jnp.asarray(rng.standard_normal(2 * n))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = jax.jit(field)(x)
    z = field.split(x)
    np.testing.assert_allclose(got, field.merge(field.vector(z)), rtol=1e-13, atol=1e-14)


def test_stop_gradient_is_kept_for_gradients():
    fn = lambda v: v[0] * lax.stop_gradient(v[0]) - lax.stop_gradient(v[1]) + v[1] * 0.0
    x = jnp.array([1.5, -0.5])
    grad = jax.grad(lambda v: scalar_graph(fn, v))(x)
    np.testing.assert_allclose(grad, jax.grad(fn)(x))
    np.testing.assert_allclose(grad, [1.5, 0.0])


def test_custom_derivative_rules_are_kept():
    """Inlined custom_jvp bodies do not change the derivatives: sinc's rule at 0 is used."""
    fn = lambda v: jnp.sinc(v) * v[1]
    x = jnp.array([0.0, 0.7])
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(scalar_graph(fn, v)))(x), jax.grad(lambda v: jnp.sum(fn(v)))(x))
    np.testing.assert_allclose(jax.jacfwd(lambda v: scalar_graph(fn, v))(x), jax.jacfwd(fn)(x))


NONFINITE = {
    "0·(1/x) at x = 0": (lambda v: 0.0 * (1.0 / v[0]) + v[1], [0.0, 2.0]),
    "0/x at x = 0": (lambda v: 0.0 / v[0] + v[1], [0.0, 2.0]),
    "inf − inf": (lambda v: (v[0] - v[0]) + v[1], [np.inf, 2.0]),
    "0·inf": (lambda v: v[0] * 0.0 + v[1], [np.inf, 2.0]),
    "sin² inf + cos² inf": (lambda v: jnp.sin(v[0]) ** 2 + jnp.cos(v[0]) ** 2 + v[1], [np.inf, 2.0]),
    "NaN in a dropped product": (lambda v: jnp.stack([v[0] * 0.0 + v[1], v[1]]), [np.nan, 2.0]),
}


@pytest.mark.parametrize("name", sorted(NONFINITE))
def test_rewrites_never_hide_a_nan(name):
    fn, x = NONFINITE[name]
    x = jnp.asarray(x)
    run = jax.jit(lambda v: scalar_graph(fn, v))
    assert np.all(np.isnan(run(x))), run(x)
    assert np.any(np.isnan(jax.jit(lambda v: scalar_graph(fn, v, enabled=False))(x)))
    finite = jnp.asarray([0.7, 2.0])  # and the rewrites do happen at finite points
    np.testing.assert_allclose(run(finite), fn(finite), rtol=1e-15)
    assert "mul" not in _emitted(fn, finite) or name == "0/x at x = 0"


def test_unseen_primitives_are_kept_whole_and_hi_primitives_expanded(rng):
    """`sort` (no rule) and a primitive defined here are kept whole and the graph is
    simplified around them; a `call_hi_primitive` (as JAX ≥ 0.11 stages `custom_root`) is
    expanded; values and derivatives are those of the function as written."""
    hijax = pytest.importorskip("jax._src.hijax")  # JAX's higher-order primitives (JAX ≥ 0.10)

    x = jnp.asarray(rng.standard_normal(4))
    cube_p = jax.extend.core.Primitive("geomjax_test_cube")
    cube_p.def_impl(lambda a: a**3)
    cube_p.def_abstract_eval(lambda a: jax.core.ShapedArray(a.shape, a.dtype))
    jax.interpreters.ad.defjvp(cube_p, lambda t, a: 3.0 * a**2 * t)
    jax.interpreters.mlir.register_lowering(cube_p, jax.interpreters.mlir.lower_fun(lambda a: a**3, multiple_results=False))

    class Square(hijax.VJPHiPrimitive):
        def __init__(self, aval):
            self.in_avals, self.out_aval, self.params = (aval,), aval, {}
            super().__init__()

        def expand(self, a):
            return a * a

        def jvp(self, primals, tangents):
            (a,), (t,) = primals, tangents
            return self(a), 2.0 * a * t

    cases = {
        "sort": (lambda v: jnp.sort(v) * (v + 0.0 * v), "sort"),
        "unseen primitive": (lambda v: cube_p.bind(v) * (1.0 * v) + 0.0 * v[0], "geomjax_test_cube"),
        "hi primitive": (lambda v: Square(jax.core.ShapedArray(v.shape, v.dtype))(v) * 1.0 + 0.0 * v, None),
    }
    for name, (fn, kept) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # simplified: no fallback warning
            ops = _emitted(fn, x)
            run = jax.jit(lambda v: scalar_graph(fn, v))
            np.testing.assert_allclose(run(x), fn(x), rtol=1e-15, err_msg=name)
        assert "call_hi_primitive" not in ops, name
        assert kept is None or kept in ops, (name, ops)
        assert ops.count("mul") <= 2 * x.size, (name, ops)  # 0·v and 1·v folded away
    t = jnp.asarray(rng.standard_normal(4))
    for name in ("unseen primitive", "hi primitive"):
        fn = cases[name][0]
        derivative = jax.jvp(lambda v: scalar_graph(fn, v), (x,), (t,))[1]
        np.testing.assert_allclose(derivative, jax.jvp(fn, (x,), (t,))[1], rtol=1e-14, err_msg=name)


def test_a_fallback_warns_once_and_the_limits_fall_back_quietly(rng):
    simplify.clear_cache()
    x = jnp.asarray(rng.standard_normal(4))
    # an operation with side effects is not reordered into a graph: the function runs as written
    fn = lambda v: jax.debug.callback(lambda a: None, v) or v * v

    with pytest.warns(UserWarning, match="side effects") as record:
        first = jax.jit(lambda v: scalar_graph(fn, v) + scalar_graph(fn, v))(x)
        jax.jit(lambda v: scalar_graph(fn, 2 * v))(x)
    assert len([w for w in record if "side effects" in str(w.message)]) == 1
    np.testing.assert_allclose(first, 2 * fn(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = jnp.asarray(rng.standard_normal(MAX_INPUTS + 1))
        scalar_graph(lambda v: 0.0 * v + v, big)


def test_expansions_are_cached_across_traces(spherical):
    simplify.clear_cache()
    y = geomjax.feedback_field(spherical.system, spherical.x0, gains=50.0)
    z = y.split(spherical.x0)
    jax.make_jaxpr(lambda z: jax.tree_util.tree_map(lambda a, b: a + b, y.rhs(0.0, z, None), y.rhs(0.0, y.rhs(0.0, z, None), None)))(z)
    info = simplify.cache_info()
    assert info["misses"] == 1 and info["hits"] == 2, info
    # a different constant folded into the graph is a different graph
    other = geomjax.feedback_field(spherical.system, spherical.x0, gains=20.0)
    jax.make_jaxpr(lambda w: other.rhs(0.0, w, None))(z)
    assert simplify.cache_info()["misses"] == 2
    # parameters traced under vmap are inputs of one cached graph
    gains = jnp.asarray([10.0, 20.0])
    batched = jax.vmap(lambda k: geomjax.feedback_field(spherical.system, spherical.x0, gains=k).rhs(0.0, z, None)[0])(gains)
    for k, row in zip(gains, batched):
        expected = geomjax.feedback_field(spherical.system, spherical.x0, gains=float(k)).vector(z)[0]
        np.testing.assert_allclose(row, expected, rtol=1e-13)


def _op_count(jaxpr) -> int:
    """Equations of a jaxpr, those of the jaxprs inside its equations included."""
    total = 0
    for eqn in jaxpr.eqns:
        subs = list(jax.extend.core.jaxprs_in_params(eqn.params))
        total += sum(_op_count(sub) for sub in subs) if subs else 1
    return total


def test_derivatives_are_simplified_graphs_with_the_same_values(spherical, rng):
    """The JVP of a simplified function is itself a simplified graph (of the original
    function's JVP): it computes what JAX's derivative computes, with fewer operations;
    reverse mode transposes it; the values agree with the derivatives as derived."""
    field = geomjax.feedback_field(spherical.system, spherical.x0, gains=3.0)
    field = field.at_start(field.split(spherical.x0))
    z = field.split(jnp.asarray(rng.standard_normal(6)))
    v = field.split(jnp.asarray(rng.standard_normal(6)))
    simplified = lambda w: field.rhs(0.0, w, None)
    as_derived = lambda w: field.vector(w)
    got, ref = jax.jvp(simplified, (z,), (v,)), jax.jvp(as_derived, (z,), (v,))
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    cot = field.split(jnp.asarray(rng.standard_normal(6)))
    got = jax.vjp(simplified, z)[1](cot)
    ref = jax.vjp(as_derived, z)[1](cot)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    # The linearised field's arithmetic: the simplified rule against JAX's JVP of the
    # field as derived (257 against 510 scalar operations when written).
    ours = _arith_count(lambda w, t: jax.jvp(simplified, (w,), (t,)), z, v)
    plain = _arith_count(lambda w, t: jax.jvp(as_derived, (w,), (t,)), z, v)
    assert ours < 0.6 * plain, (ours, plain)


def test_derivative_rules_keep_zero_tangents_and_nans(rng):
    """Zero tangents are folded (a derivative with respect to one input reads nothing of
    the others); a non-finite value a rewrite of the derivative removed still makes the
    derivative NaN, as JAX's derivative of the function as written is; reverse mode works
    where the derivative's guard reads tangents."""
    fn = lambda x, k: jnp.stack([k[0] * x[0] * x[1] + 0.0 * (x[0] * x[2]), jnp.sin(x[0]) ** 2 + jnp.cos(x[0]) ** 2 + k[1] * x[2]])
    x, k = jnp.asarray(rng.standard_normal(3)), jnp.asarray([0.5, 2.0])
    dk = jax.jacfwd(lambda k: scalar_graph(fn, x, k))(k)
    np.testing.assert_allclose(dk, jax.jacfwd(lambda k: fn(x, k))(k), rtol=1e-14)
    gx = jax.grad(lambda x: jnp.sum(scalar_graph(fn, x, k) ** 2))(x)
    np.testing.assert_allclose(gx, jax.grad(lambda x: jnp.sum(fn(x, k) ** 2))(x), rtol=1e-13)
    bad = x.at[2].set(jnp.inf)
    _, tangent = jax.jvp(lambda x: scalar_graph(fn, x, k), (bad,), (jnp.ones(3),))
    _, expected = jax.jvp(lambda x: fn(x, k), (bad,), (jnp.ones(3),))
    assert np.isnan(expected[0]) and np.isnan(tangent[0])


def test_derivatives_past_the_size_limits_keep_custom_rules_under_vmap():
    """Where the JVP's graph is past the size limits, the derivative is JAX's JVP of the
    function as written, whose custom rules stand: a RATTLE step (its Newton loop kept
    whole, differentiated by the implicit function theorem) closing over 33 traced
    parameters, batched and reverse-differentiated. The JVP of the emitted graph, where
    the custom rules are inlined, differentiated the loop itself and failed to
    transpose (`stop_gradient`), or to batch (a network trained through RATTLE)."""
    rng = np.random.default_rng(0)
    states = []
    for angle, rate in ((0.3, 0.5), (1.0, -0.4), (-0.7, 1.1)):
        q = np.array([np.sin(angle), -np.cos(angle)])
        states.append(np.concatenate([q, rate * np.array([np.cos(angle), np.sin(angle)])]))
    states = jnp.asarray(np.array(states))
    w0 = jnp.asarray(0.3 * rng.standard_normal((11, 3)))

    def loss(w, simplified=True):
        def hamiltonian(x):  # a small network as the potential: its weights are traced
            q, p = x[:2], x[2:]
            return 0.5 * p @ p + jnp.sum(w[:, 2] * jnp.tanh(w[:, :2] @ q))

        system = geomjax.System(hamiltonian, geomjax.canonical(2), holonomic=lambda q: 0.5 * (q @ q - 1.0))
        step = geomjax.rattle(system)
        step = step if simplified else simplify.unsimplified(step)

        def one(x):
            (q, p), _ = step.advance(0.0, (x[:2], x[2:]), 0.1, None)
            return jnp.sum(q**3) + jnp.sum(p**3)

        return jnp.sum(jax.vmap(one)(states))

    grad = jax.jit(jax.grad(loss))(w0)
    expected = jax.jit(jax.grad(lambda w: loss(w, simplified=False)))(w0)
    np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-13)
    # and central differences of the loss along a direction in the closed-over weights
    direction = jnp.asarray(rng.standard_normal(w0.shape))
    value = jax.jit(loss)
    eps = 1e-6
    fd = (value(w0 + eps * direction) - value(w0 - eps * direction)) / (2 * eps)
    exact = jnp.vdot(grad, direction)
    assert abs(float(exact - fd)) <= 1e-7 * abs(float(exact)) + 1e-10, (float(exact), float(fd))
