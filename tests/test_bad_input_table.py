"""The "What happens with bad input" table of docs/guide/bad_input.md, one test per row.

Each row is (input class, public function, what happens). What happens is either an
exception (type and a pattern of its message) or, for runs that cannot raise (inside
`jit`, under `vmap`, `throw=False`), the `geomjax.RESULTS` status and the step it names.
Compiled objects are shared through module-level fixtures; every run is a few steps.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
import geomjax._driver.integrate as driver

R = geomjax.RESULTS


class Ctx:
    """Models, fields and compiled runners shared by all rows."""

    def __init__(self):
        self.model = geomjax.models.spherical_pendulum()
        self.holo = geomjax.models.spherical_pendulum(holonomic=True)
        self.knife = geomjax.models.knife_edge()
        self.x0 = self.model.x0
        self.dirac = geomjax.dirac_field(self.model.system)
        self.dirac_holo = geomjax.dirac_field(self.holo.system)
        self.feedback = geomjax.feedback_field(self.model.system, self.x0, gains=50.0)
        self.rattle = geomjax.rattle(self.holo.system)
        self.strang = geomjax.strang(*geomjax.models.pendulum_flows(self.model))
        self.dla = geomjax.dla(self.knife.system)

        @eqx.filter_jit
        def run_jit(target, x, dt):
            return geomjax.integrate(target, x, dt=dt, steps=4, throw=False)

        self.run_jit = run_jit


@pytest.fixture(scope="module")
def ctx():
    return Ctx()


def run(target, x, **kw):
    kw = {"dt": 0.01, "steps": 4, **kw}
    return geomjax.integrate(target, x, **kw)


def off_pendulum(c, eps):
    """The pendulum start with a momentum component along q: q·p = eps (off T*S²)."""
    return c.x0.at[4].add(eps)


def off_knife(c, eps):
    """The knife-edge start with a sideways momentum: the constraint momentum J = −eps."""
    return c.knife.x0.at[4].add(eps)


def long_rod(c):
    """The pendulum start moved radially to |q|² = 1.5 (the rod has length 1; q·p stays 0)."""
    return c.x0.at[:3].multiply(np.sqrt(1.5))


def h_with_if(x):
    if x[0] > 0:  # Python control flow on a traced value
        return 0.5 * x[3:] @ x[3:]
    return 0.5 * x[3:] @ x[3:] + x[2]


def h_with_numpy(x):
    return 0.5 * x[3:] @ x[3:] + np.sin(x[2])


def system_with(c, **kw):
    base = {"constraints": c.model.system.constraints}
    base.update(kw)
    hamiltonian = base.pop("hamiltonian", c.model.system.hamiltonian)
    return geomjax.System(hamiltonian, geomjax.canonical(3), **base)


def singular_g(q):
    return jnp.atleast_1d((q @ q - 1.0) ** 2)  # Dg = 0 on the sphere


def cartesian_l(q, v):
    return 0.5 * v @ v - 9.81 * q[1]


def cartesian_phi(q):
    return jnp.array([q @ q - 1.0])


CARTESIAN_X0 = jnp.array([np.sin(0.5), -np.cos(0.5), 0.0, 0.0])


def sweep_one(c, **kw):
    """A sweep of one member (the Dirac pendulum), 4 steps."""
    kw = {"dt": 0.01, "steps": 4, **kw}
    return geomjax.sweep(lambda gain: (c.dirac, c.x0), geomjax.zipped(gain=[1.0]), **kw)


#: A forced oscillator reading its forcing amplitude from args.
FORCED = geomjax.TimeField(lambda t, x, a: jnp.stack([x[1], -x[0] + a * jnp.cos(t)]))


def linear_defect(th, y, h):
    """A defect with h-coefficients a·y and b·y: the conditions are a = 0, b = 0."""
    return h * th["a"] * y + h**2 * th["b"] * y


def normal_pair(key):
    return jax.random.normal(key, (2,))


def raises(exc, pattern):
    return ("raises", exc, pattern)


def status(item, step):
    return ("status", item, step)


ACCEPTED = ("accepted",)
OFF = "off the constraint set"
SQUARE = np.array([[1.0, 2.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
INDEFINITE4 = np.diag([1.0, 1.0, -1.0, 1.0])

@functools.cache
def learning():
    """A pendulum data set and an untrained network for the learning rows (built once)."""
    data = geomjax.chain_trajectories(1, 3, steps=6, key=jax.random.key(0))
    net = geomjax.ConstrainedHamiltonianNetwork(2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    return data, net


def with_entry(xs, index, value):
    xs = np.array(xs)
    xs[index] = value
    return xs


def pendulum_fit(data, **kw):
    model = geomjax.models.spherical_pendulum(holonomic=True)
    make = lambda p: geomjax.rattle(geomjax.models.spherical_pendulum(g=p["g"], holonomic=True).system)  # noqa: E731
    return geomjax.fit(make, {"g": 9.0}, model.x0[None], data, dt=0.01, max_steps=1, **kw)


def wide_constraints(q):
    """Constraints written for a double pendulum (indices 2, 3), given to a single one:
    JAX clamps the indices, so nothing fails until the start check."""
    idx = jnp.array([2, 3])
    return jnp.atleast_1d(jnp.sum(q[idx] ** 2) - 1.0)


# (id, input class, function, action(ctx), expected)
ROWS = [
    # ---------------------------------------------------------------- initial state
    ("nan-integrate", "NaN in x0", "integrate", lambda c: run(c.dirac, c.x0.at[4].set(jnp.nan)),
     raises(ValueError, r"non-finite.*indices \[4\]")),
    ("inf-feedback", "inf in x0", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0.at[0].set(jnp.inf), gains=1.0),
     raises(ValueError, r"non-finite.*indices \[0\]")),
    ("nan-rattle", "NaN in x0", "integrate(rattle)", lambda c: run(c.rattle, c.x0.at[1].set(jnp.nan)),
     raises(ValueError, "non-finite")),
    ("nan-jit", "NaN in x0, inside jit", "integrate(throw=False)", lambda c: c.run_jit(c.dirac, c.x0.at[4].set(jnp.nan), 0.01),
     status(R.nonfinite_start, 0)),
    ("nan-jit-throw", "NaN in x0, inside jit", "integrate(throw=True)",
     lambda c: eqx.filter_jit(lambda x: run(c.dirac, x))(c.x0.at[4].set(jnp.nan)),
     raises(eqx.EquinoxRuntimeError, "non-finite entries")),
    ("float32-integrate", "float32 x0", "integrate", lambda c: run(c.dirac, np.asarray(c.x0, np.float32)),
     raises(TypeError, "float32.*float64")),
    ("float32-feedback", "float32 x0", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, jnp.asarray(c.x0, jnp.float32), gains=1.0),
     raises(TypeError, "float32.*float64")),
    ("length-integrate", "x0 of wrong length", "integrate", lambda c: run(c.dirac, jnp.ones(5)),
     raises(ValueError, "length 5.*length 6")),
    ("2d-integrate", "2-D x0", "integrate", lambda c: run(c.dirac, c.x0[None, :]),
     raises(ValueError, r"one dimension.*\(1, 6\)")),
    ("2d-feedback", "2-D x0", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0.reshape(2, 3), gains=1.0),
     raises(ValueError, r"one dimension.*\(2, 3\)")),
    ("list-integrate", "list or int x0", "integrate", lambda c: run(c.dirac, [0, 1, 0, 1, 0, -1]),
     ACCEPTED),
    # ---------------------------------------------------------------- user functions
    ("h-vector", "H returns a vector", "System", lambda c: system_with(c, hamiltonian=lambda x: 0.5 * x[3:] * x[3:]),
     raises(ValueError, r"hamiltonian must return a scalar.*\(3,\)")),
    ("f-matrix", "constraints return a matrix", "System", lambda c: system_with(c, constraints=lambda x: jnp.outer(x[:3], x[:3])),
     raises(ValueError, r"constraints must return a vector.*\(3, 3\)")),
    ("f-odd", "odd number of constraints", "System", lambda c: system_with(c, constraints=lambda x: jnp.stack([x[:3] @ x[:3]])),
     raises(ValueError, "odd number")),
    ("g-matrix", "holonomic returns a matrix", "System", lambda c: system_with(c, constraints=None, holonomic=lambda q: jnp.outer(q, q)),
     raises(ValueError, r"holonomic must return a vector.*\(3, 3\)")),
    ("h-complex", "H returns complex values", "System", lambda c: system_with(c, hamiltonian=lambda x: (0.5 * x[3:] @ x[3:] + x[2]) * (1 + 0j)),
     raises(TypeError, r"the hamiltonian returns complex values \(dtype complex128\).*real")),
    ("f-complex", "constraints return complex values", "System", lambda c: system_with(c, constraints=lambda x: c.model.system.constraints(x) + 0j),
     raises(TypeError, r"constraints returns complex values")),
    ("integral-complex", "an integral returns complex values", "System", lambda c: system_with(c, integrals=lambda x: x[0] * x[4] + 0j),
     raises(TypeError, r"integrals\[0\] returns complex values")),
    ("poisson-matrix", "a matrix instead of x ↦ B(x)", "PoissonStructure", lambda c: geomjax.PoissonStructure(np.array([[0.0, 1.0], [-1.0, 0.0]])),
     raises(TypeError, r"PoissonStructure takes a callable x ↦ B\(x\), got an array of shape \(2, 2\).*lambda x: B, dim=2")),
    ("tableau-not-square", "A of shape 1 × 2 with one weight", "ImplicitTableau", lambda c: geomjax.ImplicitTableau(a=((0.5, 0.5),), b=(1.0,), order=2),
     raises(ValueError, r"A must be an s × s matrix with s = len\(b\) = 1 stage; got 1 row of length \[2\]")),
    ("h-if", "`if x[0] > 0:` in H", "System", lambda c: system_with(c, hamiltonian=h_with_if),
     raises(TypeError, "hamiltonian uses Python control flow.*jnp.where / lax.cond")),
    ("h-numpy", "`np.sin(x)` in H", "System", lambda c: system_with(c, hamiltonian=h_with_numpy),
     raises(TypeError, "hamiltonian converts a traced JAX array to a NumPy array.*jax.numpy")),
    ("field-if", "`if` in a plain field", "integrate", lambda c: run(lambda x: -x if x[0] > 0 else x, c.x0),
     raises(TypeError, "vector field uses Python control flow")),
    ("step-numpy", "`np.sin` in a step function", 'integrate(method="step")', lambda c: run(lambda x, h: x + h * np.sin(x), c.x0, method="step"),
     raises(TypeError, "step function converts a traced JAX array")),
    # ---------------------------------------------------------------- singular constraints
    ("q0-dirac", "C singular at x0 (q = 0)", "integrate(dirac_field)", lambda c: run(c.dirac, jnp.array([0.0, 0, 0, 1, 0, -1])),
     raises(ValueError, "constraint matrix.*singular")),
    ("q0-feedback", "C singular at x0 (q = 0)", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, jnp.array([0.0, 0, 0, 1, 0, -1]), gains=1.0),
     raises(ValueError, "constraint matrix.*singular")),
    ("q0-jit", "C singular at x0 (q = 0), inside jit", "integrate(throw=False)", lambda c: c.run_jit(c.dirac, jnp.array([0.0, 0, 0, 1, 0, -1]), 0.01),
     status(R.nonfinite_first_step, 1)),
    ("dg0-rattle", "g = (|q|² − 1)², Dg = 0 on S", "integrate(rattle)", lambda c: run(geomjax.rattle(system_with(c, constraints=None, holonomic=singular_g)), c.x0),
     raises(ValueError, "not independent")),
    ("dg0-dirac", "g = (|q|² − 1)², Dg = 0 on S", "integrate(dirac_field)", lambda c: run(geomjax.dirac_field(system_with(c, constraints=None, holonomic=singular_g)), c.x0),
     raises(ValueError, "singular")),
    # ---------------------------------------------------------------- starts off S
    *[
        row
        for eps in (1e-6, 0.1)
        for row in (
            (f"off{eps}-dirac", f"x0 off S by {eps}", "integrate(dirac_field(holonomic=g))", lambda c, e=eps: run(c.dirac_holo, off_pendulum(c, e)),
             raises(ValueError, OFF)),
            (f"off{eps}-dirac-f", f"x0 off S by {eps}", "integrate(dirac_field(constraints=f))", lambda c, e=eps: run(c.dirac, off_pendulum(c, e)),
             ACCEPTED),
            (f"off{eps}-feedback", f"x0 off S by {eps}", "feedback_field(holonomic=g)", lambda c, e=eps: geomjax.feedback_field(c.holo.system, off_pendulum(c, e), gains=1.0),
             raises(ValueError, OFF)),
            (f"off{eps}-rattle", f"x0 off S by {eps}", "integrate(rattle)", lambda c, e=eps: run(c.rattle, off_pendulum(c, e)),
             raises(ValueError, OFF)),
            (f"off{eps}-strang", f"x0 off S by {eps}", "integrate(strang(*pendulum_flows))", lambda c, e=eps: run(c.strang, off_pendulum(c, e)),
             raises(ValueError, OFF)),
            (f"off{eps}-dla", f"x0 off S by {eps}", "integrate(dla) (knife edge)", lambda c, e=eps: run(c.dla, off_knife(c, e)),
             raises(ValueError, OFF)),
            (f"off{eps}-gauss4", f"x0 off S by {eps}", 'integrate(dirac_field(holonomic=g), method="gauss4")', lambda c, e=eps: run(c.dirac_holo, off_pendulum(c, e), method="gauss4"),
             raises(ValueError, OFF)),
        )
    ],
    *[
        row
        for eps in (1e-3, 0.5)
        for row in (
            (f"off{eps}-feedback-f", f"x0 off the level of f by {eps}", "feedback_field(constraints=f)",
             lambda c, e=eps: geomjax.feedback_field(c.model.system, off_pendulum(c, e), gains=1.0), ACCEPTED),
            (f"off{eps}-feedback-holonomic", f"x0 off S by {eps}", "feedback_field(holonomic=g)",
             lambda c, e=eps: geomjax.feedback_field(c.holo.system, off_pendulum(c, e), gains=1.0), raises(ValueError, OFF + ".*start_tol=None")),
            (f"off{eps}-feedback-holonomic-start-tol-none", f"x0 off S by {eps}, start_tol=None", "feedback_field(holonomic=g)",
             lambda c, e=eps: geomjax.feedback_field(c.holo.system, off_pendulum(c, e), gains=1.0, start_tol=None), ACCEPTED),
            (f"off{eps}-feedback-knife", f"x0 off J = 0 by {eps}", "feedback_field (knife edge)",
             lambda c, e=eps: geomjax.feedback_field(c.knife.system, off_knife(c, e), gains=1.0), raises(ValueError, OFF)),
            (f"off{eps}-feedback-knife-start-tol-none", f"x0 off J = 0 by {eps}, start_tol=None", "feedback_field (knife edge)",
             lambda c, e=eps: geomjax.feedback_field(c.knife.system, off_knife(c, e), gains=1.0, start_tol=None), ACCEPTED),
        )
    ],
    ("feedback-start-tol-string", "start_tol = '1e-8' (a string)", "feedback_field",
     lambda c: geomjax.feedback_field(c.holo.system, c.x0, gains=1.0, start_tol="1e-8"),
     raises(TypeError, "start_tol must be a non-negative number .*got the string '1e-8'")),
    ("off-jit-rattle", "x0 off S by 0.1, inside jit", "integrate(rattle, throw=False)", lambda c: c.run_jit(c.rattle, off_pendulum(c, 0.1), 0.01),
     status(R.off_constraint_set, 0)),
    ("off-start-tol-none", "x0 off S by 1e-6, start_tol=None", "integrate(dirac_field(holonomic=g))", lambda c: run(c.dirac_holo, off_pendulum(c, 1e-6), start_tol=None),
     ACCEPTED),
    ("long-rod-strang", "|q|² = 1.5 for a rod of length 1 (q·p = 0)", "integrate(strang(*pendulum_flows))", lambda c: run(c.strang, long_rod(c)),
     raises(ValueError, OFF + ".*residual is 0.5")),
    ("long-rod-lie-trotter", "|q|² = 1.5 for a rod of length 1 (q·p = 0)", "integrate(lie_trotter(*pendulum_flows))",
     lambda c: run(geomjax.lie_trotter(*geomjax.models.pendulum_flows(c.model)), long_rod(c)),
     raises(ValueError, OFF + ".*residual is 0.5")),
    ("off0.1-triple-jump-rattle", "x0 off S by 0.1", "integrate(triple_jump(rattle))", lambda c: run(geomjax.triple_jump(c.rattle), off_pendulum(c, 0.1)),
     raises(ValueError, OFF)),
    ("long-rod-strang-jit", "|q|² = 1.5 for a rod of length 1, inside jit", "integrate(strang(*pendulum_flows), throw=False)", lambda c: c.run_jit(c.strang, long_rod(c), 0.01),
     status(R.off_constraint_set, 0)),
    # ---------------------------------------------------------------- gains and metrics
    ("gain-zero", "gains = 0", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=0.0),
     raises(ValueError, "gains must include a positive entry")),
    ("gain-negative", "gains = −1", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=-1.0),
     raises(ValueError, r"gains must be non-negative.*\[0, 1, 2, 3\]")),
    ("gain-some-zero", "gains (0, 0, 50, 50): some zero", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=[0.0, 0.0, 50.0, 50.0]),
     ACCEPTED),
    ("gain-nan", "gains = NaN", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=np.nan),
     raises(ValueError, "gains must be finite")),
    ("gain-nonsymmetric", "non-symmetric gain matrix", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=SQUARE),
     raises(ValueError, "K must be symmetric")),
    ("gain-indefinite", "indefinite gain matrix", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=INDEFINITE4),
     raises(ValueError, "positive definite.*-1")),
    ("metric-zero", "metric = 0", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=0.0),
     raises(ValueError, "positive scalar")),
    ("metric-negative", "metric = −1", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=-1.0),
     raises(ValueError, "positive scalar")),
    ("metric-nan", "metric = NaN", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=np.nan),
     raises(ValueError, "positive scalar, got nan")),
    ("metric-nonsymmetric", "non-symmetric metric matrix", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=np.triu(np.ones((6, 6)))),
     raises(ValueError, "symmetric")),
    ("metric-indefinite", "indefinite metric matrix", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=np.diag([1.0] * 5 + [-1.0])),
     raises(ValueError, "positive definite")),
    ("metric-callable-bad", "callable metric, L(x0) = −I", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=lambda x: -jnp.eye(6)),
     raises(ValueError, r"L\(x0\) must be positive definite")),
    ("metric-callable-shape", "callable metric of wrong shape", "feedback_field", lambda c: geomjax.feedback_field(c.model.system, c.x0, gains=1.0, metric=lambda x: jnp.eye(3)),
     raises(ValueError, r"scalar or a \(6, 6\) matrix")),
    ("metric-callable-late", "callable metric, L(x0) = −I, field built without x0", "integrate", lambda c: run(geomjax.feedback_field(c.model.system, gains=1.0, metric=lambda x: -jnp.eye(6)), c.x0),
     raises(ValueError, r"L\(x0\) must be positive definite")),
    # ---------------------------------------------------------------- dt, steps, save_every
    *[
        (f"dt-{dt}", f"dt = {dt}", "integrate", lambda c, d=dt: run(c.dirac, c.x0, dt=d), raises(ValueError, "dt must be a positive finite"))
        for dt in (0.0, -0.01, float("nan"))
    ],
    ("dt-nan-jit", "dt = NaN, inside jit", "integrate(throw=False)", lambda c: c.run_jit(c.dirac, c.x0, jnp.asarray(jnp.nan)),
     status(R.invalid_step_size, 0)),
    ("dt-zero-jit", "dt = 0 or −0.01, inside jit", "integrate(throw=False)", lambda c: c.run_jit(c.dirac, c.x0, jnp.asarray(0.0)),
     status(R.invalid_step_size, 0)),
    ("dt-negative-jit", "dt = 0 or −0.01, inside jit", "integrate(throw=False)", lambda c: c.run_jit(c.dirac, c.x0, jnp.asarray(-0.01)),
     status(R.invalid_step_size, 0)),
    ("dt-string", "dt = '0.01' (a string)", "integrate", lambda c: run(c.dirac, c.x0, dt="0.01"),
     raises(TypeError, "dt must be a positive finite scalar, got the string '0.01'; pass a number, not text: dt=0.01")),
    ("dt-complex", "dt = 0.01 + 0j", "integrate", lambda c: run(c.dirac, c.x0, dt=0.01 + 0j),
     raises(TypeError, r"dt must be a positive finite scalar, got the complex number \(0.01\+0j\): geomjax steps in real time")),
    ("drift-tol-string", "drift_tol = '1e-2' (a string)", "integrate", lambda c: run(c.dirac, c.x0, drift_tol="1e-2"),
     raises(TypeError, "drift_tol must be a positive number .*got the string '1e-2'")),
    ("dt-string-sweep", "dt = '0.01' (a string)", "sweep", lambda c: sweep_one(c, dt="0.01"),
     raises(TypeError, "dt must be a positive finite scalar, got the string '0.01'")),
    ("dt-complex-sweep", "dt = 0.01 + 0j", "sweep", lambda c: sweep_one(c, dt=0.01 + 0j),
     raises(TypeError, "dt must be a positive finite scalar, got the complex number")),
    ("drift-tol-string-sweep", "drift_tol = '1e-2' (a string)", "sweep", lambda c: sweep_one(c, drift_tol="1e-2"),
     raises(TypeError, "drift_tol must be a positive number .*got the string '1e-2'")),
    ("t0-nan", "t0 = NaN", "integrate", lambda c: run(c.dirac, c.x0, t0=float("nan")),
     raises(ValueError, "t0 must be a finite real number .*got nan")),
    ("t0-inf-sweep", "t0 = inf", "sweep", lambda c: sweep_one(c, t0=float("inf")),
     raises(ValueError, "t0 must be a finite real number .*got inf")),
    ("t0-nan-jit", "t0 = NaN, inside jit", "integrate(throw=False)",
     lambda c: eqx.filter_jit(lambda t0: geomjax.integrate(c.dirac, c.x0, dt=0.01, steps=4, t0=t0, throw=False))(jnp.asarray(jnp.nan)),
     status(R.invalid_step_size, 0)),
    ("timefield-no-args", "a TimeField whose f reads args, args=None", "integrate",
     lambda c: geomjax.integrate(FORCED, jnp.array([1.0, 0.0]), dt=0.01, steps=4),
     raises(TypeError, r"f\(t, x, args\) uses its args, but the run was given none \(args=None\).*args=")),
    ("timefield-no-args-sweep", "a TimeField whose f reads args, args=None", "sweep",
     lambda c: geomjax.sweep(lambda a: (FORCED, jnp.array([1.0, a])), geomjax.zipped(a=[0.0]), dt=0.01, steps=4),
     raises(TypeError, r"uses its args, but the run was given none")),
    ("timefield-with-args", "the same TimeField with args=0.5", "integrate",
     lambda c: geomjax.integrate(FORCED, jnp.array([1.0, 0.0]), dt=0.01, steps=4, args=0.5),
     ACCEPTED),
    *[
        (f"steps-{s!r}", f"steps = {s!r}", "integrate", lambda c, s=s: run(c.dirac, c.x0, steps=s), raises(ValueError, "steps must be a positive integer"))
        for s in (0, -1, 2.5, True)
    ],
    ("steps-int64", "steps = np.int64(4)", "integrate", lambda c: run(c.dirac, c.x0, steps=np.int64(4)), ACCEPTED),
    ("save-every", "save_every not dividing steps", "integrate", lambda c: run(c.dirac, c.x0, steps=10, save_every=3),
     raises(ValueError, r"multiple of save_every")),
    # ---------------------------------------------------------------- Newton, stability
    ("newton-rattle", "h too large for Newton (h = 2)", "integrate(rattle)", lambda c: run(c.rattle, c.x0, dt=2.0),
     raises(geomjax.IntegrationError, "failed at step 1.*Newton solve")),
    ("newton-vmap", "h = 2 for one vmap member", "vmap(integrate(rattle, throw=False))",
     lambda c: jax.vmap(lambda d: geomjax.integrate(c.rattle, c.x0, dt=d, steps=4, throw=False))(jnp.array([0.01, 2.0, 0.01])),
     ("vmap", [R.successful, R.newton_failed, R.successful])),
    ("lagrangian-singular", "L with ∂²L/∂v² singular (L = q·v − ½|q|²)", "LagrangianSystem, ContactLagrangianSystem",
     lambda c: geomjax.LagrangianSystem(lambda q, v: q @ v - 0.5 * q @ q, 2), raises(ValueError, "∂²L/∂v² is singular")),
    ("herglotz-singular-at-x0", "∂²L/∂v² singular at x0 (mass ∝ |q|², q0 = 0)", "integrate(herglotz)",
     lambda c: geomjax.integrate(geomjax.herglotz(lambda q, v, z: 0.5 * (q @ q) * (v @ v) - z), jnp.array([0.0, 0.0, 1.0, 1.0, 0.0]), dt=0.1, steps=2),
     raises(ValueError, "∂²L/∂v² is singular at x0")),
    ("constraint-not-affine", "a velocity constraint not affine in v (v₀² − q₁v₁)", "LagrangianSystem, herglotz",
     lambda c: geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 2, nonholonomic=geomjax.VelocityConstraint(lambda q, v: v[0] ** 2 - q[1] * v[1])),
     raises(ValueError, "not affine in the velocity")),
    ("herglotz-newton", "Newton does not converge in a Herglotz step (max_steps=1, L not quadratic in v)", "integrate(herglotz)",
     lambda c: geomjax.integrate(geomjax.herglotz(lambda q, v, z: 0.5 * v @ v + (v @ v) ** 2 / 12 + jnp.cos(q[0]) - 0.5 * z, order=2, newton=geomjax.Newton(max_steps=1)), jnp.array([0.3, 0.2, 0.0]), dt=0.1, steps=5),
     raises(geomjax.IntegrationError, "step 1.*Newton")),
    # ---------------------------------------------------------------- Dirac integrators (Cartesian pendulum)
    ("dirac-odd-length", "x0 of odd length", "integrate(dirac1)",
     lambda c: geomjax.integrate(geomjax.dirac1(cartesian_l, holonomic=cartesian_phi), jnp.ones(5), dt=0.1, steps=2),
     raises(ValueError, "flat states x = \\(q, p\\) of even length")),
    ("dirac-dependent", "φ = (|q|² − 1, 2(|q|² − 1)): dependent constraints", "integrate(dirac1), integrate(dirac2)",
     lambda c: geomjax.integrate(geomjax.dirac2(cartesian_l, holonomic=lambda q: jnp.array([q @ q - 1.0, 2 * (q @ q) - 2.0])), CARTESIAN_X0, dt=0.1, steps=2),
     raises(ValueError, "constraint one-forms .* linearly dependent")),
    ("dirac-off", "q0 off φ = 0 by 1e−3", "integrate(dirac1)",
     lambda c: geomjax.integrate(geomjax.dirac1(cartesian_l, holonomic=cartesian_phi), CARTESIAN_X0.at[0].add(1e-3), dt=0.1, steps=2),
     raises(ValueError, "off the constraint set")),
    ("dirac-newton", "Newton does not converge (L quartic in v, max_steps=1)", "integrate(dirac1(constraint=\"position\"))",
     lambda c: geomjax.integrate(geomjax.dirac1(lambda q, v: cartesian_l(q, v) + (v @ v) ** 2, holonomic=cartesian_phi, constraint="position", newton=geomjax.Newton(max_steps=1)), CARTESIAN_X0, dt=0.1, steps=5, drift_tol=None),
     raises(geomjax.IntegrationError, "step 1.*Newton")),
    ("dirac-drift", "Dirac-1 with the default drift_tol over 60 s", "integrate(dirac1)",
     lambda c: geomjax.integrate(geomjax.dirac1(cartesian_l, holonomic=cartesian_phi), CARTESIAN_X0, dt=0.02, steps=3000, save_every=100),
     raises(geomjax.IntegrationError, "drifted|constraint")),
    ("dirac2-stepsolver", "a multistep step given to diffrax", "StepSolver(dirac2)",
     lambda c: geomjax.StepSolver(geomjax.dirac2(cartesian_l, holonomic=cartesian_phi)),
     raises(ValueError, "multistep method")),
    ("euler-1.5", "feedback Euler at 1.5 × euler_step_limit", "integrate", lambda c: run(c.feedback, c.x0, dt=1.5 * float(c.feedback.euler_step_limit(c.x0)), steps=40),
     raises(geomjax.IntegrationError, "first integral drifted")),
    ("euler-3", "feedback Euler at 3 × euler_step_limit, drift_tol=None", "integrate", lambda c: run(c.feedback, c.x0, dt=3.0 * float(c.feedback.euler_step_limit(c.x0)), steps=40, drift_tol=None),
     raises(geomjax.IntegrationError, "non-finite after finite steps.*stability limit")),
    # ---------------------------------------------------------------- gain checks
    ("check-gains-dt-negative", "dt = −1", "check_gains", lambda c: geomjax.check_gains(c.feedback, c.x0, -1.0),
     raises(ValueError, "dt must be a positive finite scalar, got -1.0")),
    ("check-gains-dt-nan", "dt = NaN", "check_gains", lambda c: geomjax.check_gains(c.feedback, c.x0, float("nan")),
     raises(ValueError, "dt must be a positive finite scalar, got nan")),
    ("check-gains-nan-start", "NaN in x0", "check_gains", lambda c: geomjax.check_gains(c.feedback, c.x0.at[2].set(jnp.nan), 1e-3),
     raises(ValueError, r"x0 has non-finite entries \(NaN or inf\) at indices \[2\]")),
    ("check-gains-dirac", "a Dirac field (no feedback)", "check_gains, recommended_gains", lambda c: geomjax.recommended_gains(c.dirac, c.x0, 1e-3),
     raises(TypeError, "check_gains needs a feedback field .*got a DiracField")),
    *[
        (f"adaptive-dt-{dt}", f"dt = {dt}", "feedback_field(...).adaptive", lambda c, d=dt: c.feedback.adaptive(dt=d),
         raises(ValueError, f"dt must be a positive finite scalar, got {dt}: the adaptive gain"))
        for dt in (0.0, float("nan"))
    ],
    # ---------------------------------------------------------------- diagnostics and results
    *[
        (f"constraint-matrix-{n}", f"a length-{n} state of a 6-dimensional system", "constraint_matrix",
         lambda c, n=n: geomjax.constraint_matrix(c.model.system, jnp.ones(n)), raises(ValueError, f"x has length {n}, but the system's state has length 6"))
        for n in (4, 8)
    ],
    ("sweep-message-range", "message(5) of a one-member sweep", "SweepResult.message", lambda c: sweep_one(c).message(5),
     raises(IndexError, r"grid position \(5,\) is out of range: axis 0 has 1 member, so its index must be in 0\.\.0")),
    ("sweep-message-axes", "message() without an index", "SweepResult.message", lambda c: sweep_one(c).message(),
     raises(IndexError, r"one index per axis of the grid, whose shape is \(1,\)")),
    ("drift-slope-nan", "NaN in the error series (saves after a failure)", "diagnostics.drift_slope",
     lambda c: geomjax.diagnostics.drift_slope(np.linspace(0.0, 1.0, 20), np.r_[np.ones(17), np.full(3, np.nan)]),
     raises(ValueError, r"errors has non-finite entries \(NaN or inf\) at indices \[17, 18, 19\].*sol.failed_step")),
    ("drift-slope-ts-inf", "inf in the times", "diagnostics.drift_slope",
     lambda c: geomjax.diagnostics.drift_slope(np.r_[np.linspace(0.0, 1.0, 19), np.inf], np.ones(20)),
     raises(ValueError, r"ts has non-finite entries \(NaN or inf\) at indices \[19\]")),
    ("order-conditions-nan-sample", "sample(key) returns NaN", "order_conditions",
     lambda c: geomjax.order_conditions(linear_defect, ("a", "b"), lambda k: jnp.full(2, jnp.nan), [1, 2]),
     raises(ValueError, r"sample\(key\) returned non-finite values \(NaN or inf\) for samples \[0, 1, 2, 3\] of 4")),
    ("order-conditions-nan-defect", "a defect that is NaN (0/0 in θ)", "order_conditions",
     lambda c: geomjax.order_conditions(lambda th, y, h: h * th["a"] * y / (th["b"] - th["b"]), ("a", "b"), normal_pair, [1]),
     raises(ValueError, r"Taylor coefficients in h are not finite .*first at θ = \(a = ")),
    ("order-conditions-theta-range", "theta_range = (NaN, 1)", "order_conditions",
     lambda c: geomjax.order_conditions(linear_defect, ("a", "b"), normal_pair, [1], theta_range=(np.nan, 1.0)),
     raises(ValueError, r"theta_range must be two finite numbers lo < hi")),
    ("random-polynomial-degree", "degree = −1", "random_polynomial", lambda c: geomjax.random_polynomial(jax.random.key(0), 2, -1),
     raises(ValueError, "degree must be a non-negative integer .*got -1")),
    # ---------------------------------------------------------------- learning and fit
    ("train-empty", "empty data (0 trajectories)", "train",
     lambda c: geomjax.train(learning()[1], np.zeros((0, 9, 4)), dt=0.03, epochs=1, key=jax.random.key(0)),
     raises(ValueError, r"the data hold 0 trajectories")),
    ("train-one-nan", "one NaN observation", "train",
     lambda c: geomjax.train(learning()[1], with_entry(learning()[0].xs, (0, 2, 1), np.nan), dt=0.03, epochs=1, key=jax.random.key(0)),
     raises(ValueError, r"1 non-finite observations \(NaN or inf\), the first at trajectory 0, observation 2, entry 1")),
    ("train-all-nan", "all observations NaN", "train",
     lambda c: geomjax.train(learning()[1], np.full((2, 5, 4), np.nan), dt=0.03, epochs=1, key=jax.random.key(0)),
     raises(ValueError, r"40 non-finite observations")),
    ("train-momentum-data", "momentum-observed data, velocity-observed network", "train",
     lambda c: geomjax.train(learning()[1], geomjax.chain_trajectories(1, 2, steps=4, observed="momentum", key=jax.random.key(0)),
                             epochs=1, key=jax.random.key(0)),
     raises(ValueError, r"observed as momentum .* expects observed='velocity'")),
    ("train-dt-zero", "dt = 0", "train",
     lambda c: geomjax.train(learning()[1], learning()[0].xs, dt=0.0, epochs=1, key=jax.random.key(0)),
     raises(ValueError, r"train: dt must be a positive finite scalar")),
    ("rollout-off-set", "|q| = 1.2 on a unit pendulum", "rollout",
     lambda c: geomjax.rollout(learning()[1], jnp.array([1.2, 0.0, 0.3, 0.5]), 10, 0.03, "rk4"),
     raises(ValueError, r"start 0 is off the model's constraint set.* start_tol=None")),
    ("rollout-batch", "a batch of starts", "rollout", lambda c: geomjax.rollout(learning()[1], jnp.ones((3, 4)), 5, 0.03),
     raises(ValueError, r"takes one state x0 of shape \(4,\), got a batch .*jax.vmap")),
    ("rollout-length", "x0 of length 5 for a 4-state model", "rollout", lambda c: geomjax.rollout(learning()[1], jnp.ones(5), 5, 0.03),
     raises(ValueError, r"x0 must be one observed state of shape \(4,\)")),
    ("rollout-dt-nan", "dt = NaN", "rollout", lambda c: geomjax.rollout(learning()[1], learning()[0].xs[0, 0], 5, float("nan")),
     raises(ValueError, r"rollout: dt must be a positive finite scalar, got nan")),
    ("rollout-wide-constraints", "constraints written for another dimension", "rollout",
     lambda c: geomjax.rollout(geomjax.ConstrainedHamiltonianNetwork(2, wide_constraints, width_size=4, depth=1, key=jax.random.key(1)),
                               jnp.array([0.6, -0.8, 0.8, 0.6]), 5, 0.03),
     raises(ValueError, r"off the model's constraint set.*written for this state")),
    ("rollout-error-empty", "no trajectories", "rollout_error", lambda c: geomjax.rollout_error(learning()[1], np.zeros((0, 5, 4)), dt=0.03),
     raises(ValueError, r"rollout_error: the data hold 0 trajectories")),
    ("rollout-error-nan", "one NaN observation", "rollout_error",
     lambda c: geomjax.rollout_error(learning()[1], with_entry(learning()[0].xs, (1, 3, 0), np.nan), dt=0.03),
     raises(ValueError, r"rollout_error: the data hold 1 non-finite observations")),
    ("node-sized-like-node", "a NeuralODE to match", "NeuralODE.sized_like",
     lambda c: geomjax.NeuralODE.sized_like(geomjax.NeuralODE(4, width_size=4, depth=1, key=jax.random.key(0)), key=jax.random.key(1)),
     raises(TypeError, r"sized_like takes a ConstrainedHamiltonianNetwork")),
    ("fit-inf", "an infinite observation", "fit", lambda c: pendulum_fit(with_entry(np.zeros((1, 3, 6)), (0, 1, 2), np.inf)),
     raises(ValueError, r"1 infinite observations, the first at trajectory 0, save 1, entry 2.*NaN marks a missing")),
    ("fit-no-finite", "no finite observation", "fit", lambda c: pendulum_fit(np.full((1, 3, 6), np.nan)),
     raises(ValueError, r"no finite observation in the data")),
    ("fit-start-included", "data that include the start, start_observed=False", "fit",
     lambda c: pendulum_fit(np.stack([geomjax.models.spherical_pendulum(holonomic=True).x0] * 3)[None]),
     raises(ValueError, r"first save of every trajectory equals its start x0.*start_observed=True")),
    # ---------------------------------------------------------------- first-hour frictions (issue 38)
    ("steps-overflow", "steps = save_every = 10**30", "integrate", lambda c: run(c.dirac, c.x0, steps=10**30, save_every=10**30),
     raises(ValueError, r"steps must be at most 2\*\*62 \(the step counter is an int64\)")),
    ("jit-feedback-field", "jax.jit(feedback_field(...))(x0)", "jax.jit", lambda c: jax.jit(c.feedback)(c.x0),
     raises(TypeError, r"FeedbackField holds arrays .* equinox.filter_jit\(field\)\(x\)")),
    ("accuracy-tol-string", "accuracy_tol = '1e-3'", "integrate", lambda c: run(c.dirac, c.x0, accuracy_tol="1e-3"),
     raises(TypeError, r"accuracy_tol must be a positive number .*got the string '1e-3'")),
    ("accuracy-tol-bool", "accuracy_tol = True", "integrate", lambda c: run(c.dirac, c.x0, accuracy_tol=True),
     raises(TypeError, r"accuracy_tol must be a positive number .*got the bool True")),
    ("names-generator", "names given as a generator (one name too many)", "System",
     lambda c: geomjax.System(c.model.system.hamiltonian, geomjax.canonical(3), names=(n for n in ["H", "I"])),
     raises(ValueError, r"names has 2 entries, but this system's quantities .* have 1")),
    ("hamiltonian-q-p", "H(q, p) with two arguments", "System",
     lambda c: geomjax.System(lambda q, p: 0.5 * p @ p + q @ q, geomjax.canonical(1)),
     raises(TypeError, r"takes 2 arguments \(q, p\), but geomjax calls it as H\(x\) .*lambda x: H\(x\[:1\], x\[1:\]\)")),
    ("names-dimensionless-structure", "one name for two quantities, a PoissonStructure without dim", "integrate",
     lambda c: run(geomjax.dirac_field(geomjax.System(lambda x: 0.5 * x @ x, geomjax.PoissonStructure(lambda x: jnp.array([[0.0, 1.0], [-1.0, 0.0]])),
                                                      integrals=[lambda x: x[0] ** 2], names=("a",))), jnp.array([1.0, 0.0])),
     raises(ValueError, r"names has 1 entries, but this system's quantities .* have 2")),
    ("invariant-errors-solution", "a Solution instead of sol.xs", "diagnostics.invariant_errors",
     lambda c: geomjax.diagnostics.invariant_errors(c.model.system, run(c.dirac, c.x0)),
     raises(TypeError, r"not a geomjax.Solution: pass sol.xs")),
]


@pytest.mark.parametrize("row_id, what, function, action, expected", ROWS, ids=[r[0] for r in ROWS])
def test_row(ctx, row_id, what, function, action, expected):
    kind = expected[0]
    if kind == "raises":
        _, exc, pattern = expected
        with pytest.raises(exc, match=pattern):
            action(ctx)
    elif kind == "status":
        _, item, step = expected
        sol = action(ctx)
        assert sol.result == item, sol.message
        assert int(sol.failed_step) == step
        # Saves after the failure are NaN: a failed run never looks finite.
        assert not np.isfinite(np.asarray(sol.xs[-1])).all()
    elif kind == "vmap":
        sol = action(ctx)
        np.testing.assert_array_equal(np.asarray(sol.status), [int(item._value) for item in expected[1]])
    else:
        out = action(ctx)
        if isinstance(out, geomjax.Solution):
            assert bool(out.ok), out.message
            assert out.xs.dtype == jnp.float64


def test_long_runs_count_steps_in_int64_and_across_chunks(monkeypatch):
    """steps = 2**31 + 5 is accepted (traced, not run) and the counters are int64; a run
    split into compiled chunks reports every step."""
    step = geomjax.FunctionStep(lambda x, h: x + h)
    big = 2**31 + 5
    shapes = jax.eval_shape(
        lambda x: geomjax.integrate(step, x, dt=1.0, steps=big, save_every=big, throw=False), jnp.zeros(1)
    )
    assert shapes.xs.shape == (2, 1)
    assert shapes.num_steps.dtype == jnp.int64 and shapes.failed_step.dtype == jnp.int64
    monkeypatch.setattr(driver, "_CHUNK_STEPS", 8)
    sol = geomjax.integrate(step, jnp.zeros(1), dt=1.0, steps=100, save_every=5)
    assert int(sol.num_steps) == 100 and float(sol.xs[-1, 0]) == 100.0 and sol.xs.shape == (21, 1)
