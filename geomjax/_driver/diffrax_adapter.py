"""A diffrax solver that runs a geomjax step, so `diffrax.diffeqsolve` users can plug in steps."""

from collections.abc import Callable
from typing import ClassVar

import diffrax

from .._status import RESULTS
from .._step.base import AbstractStep, FunctionStep


class StepSolver(diffrax.AbstractSolver):
    """Use a geomjax step (RATTLE, a splitting, an RK step of a feedback field, or any
    `step(x, h) ↦ x_next`) as a fixed-step `diffrax` solver.

    The step carries its own dynamics, so the term given to `diffeqsolve` is not
    evaluated: pass any term, e.g. `diffrax.ODETerm(lambda t, y, args: y)`. Use
    `diffrax.ConstantStepSize()` (the default) and `SaveAt(steps=True)` or a `ts` grid on
    the step points for constrained systems: `SaveAt(ts=...)` between steps interpolates
    linearly and leaves the constraint manifold. A step whose status is not success (e.g.
    a Newton solve that did not converge) ends the solve with
    `diffrax.RESULTS.nonlinear_divergence`.

    **Arguments:**

    - `step`: a geomjax step, or a callable `step(x, h) ↦ x_next` on flat states.
    - `order`: the step's order (for diffrax's bookkeeping; fixed steps do not use it).

    Example:

    ```python
    >>> import diffrax, geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    >>> solver = geomjax.StepSolver(geomjax.explicit_rk(Y, geomjax.RK4))
    >>> sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, a: y), solver,
    ...                           t0=0.0, t1=1.0, dt0=1e-2, y0=model.x0,
    ...                           saveat=diffrax.SaveAt(steps=True))
    >>> sol.ys.shape
    (4096, 6)

    ```
    """

    step_map: AbstractStep
    step_order: int = 1

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar[Callable[..., diffrax.LocalLinearInterpolation]] = (
        diffrax.LocalLinearInterpolation
    )

    def __init__(self, step, order: int = 1):
        self.step_map = step if isinstance(step, AbstractStep) else FunctionStep(step)
        if self.step_map.carries_history:
            raise ValueError(
                "StepSolver takes one-step methods; this step is a multistep method (it "
                "carries past values from step to step, which diffrax's steps cannot): run "
                "it with geomjax.integrate"
            )
        self.step_order = order

    def order(self, terms):
        return self.step_order

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del terms, solver_state, made_jump
        z1, status = self.step_map.advance(t0, self.step_map.split(y0), t1 - t0, args)
        y1 = self.step_map.merge(z1)
        result = diffrax.RESULTS.where(
            status == RESULTS.successful,
            diffrax.RESULTS.successful,
            diffrax.RESULTS.nonlinear_divergence,
        )
        return y1, None, dict(y0=y0, y1=y1), None, result

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)
