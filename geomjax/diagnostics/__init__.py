"""Verification harness: invariant errors, measured orders, drift and symplecticity.

- `invariant_errors`, `constraint_errors`, `energy_errors`: error series along a trajectory.
- `final_state`, `global_errors`: final states and global errors for many step sizes from
  one compilation; `convergence_order`: least-squares log–log slope with the round-off
  plateau removed.
- `drift_slope`: secular drift of an error series from its per-window maxima.
- `symplecticity_defect`: ‖DΦᵀΩDΦ − Ω‖ of a step map by `jax.jacfwd`, restricted to the
  constraint manifold for constrained methods (`tangent_projector`); `poisson_defect`
  for Lie–Poisson structures.

Example:

```python
import geomjax
from geomjax import diagnostics

model = geomjax.models.spherical_pendulum(holonomic=True)
step = geomjax.rattle(model.system)
ns = [40, 80, 160, 320]
ref, _ = diagnostics.final_state(step, model.x0, 1.0 / 5120, 5120)
errs = diagnostics.global_errors(step, model.x0, 1.0, ns, ref)
diagnostics.convergence_order([1.0 / n for n in ns], errs).order   # ≈ 2
diagnostics.symplecticity_defect(step, model.x0, 0.1, model.system)  # round-off
```
"""

from ._drift import DriftFit as DriftFit, drift_slope as drift_slope
from ._errors import (
    constraint_errors as constraint_errors,
    energy_errors as energy_errors,
    invariant_errors as invariant_errors,
)
from ._order import OrderFit as OrderFit, convergence_order as convergence_order
from ._runs import final_state as final_state, global_errors as global_errors, step_jacobian as step_jacobian
from ._symplectic import (
    poisson_defect as poisson_defect,
    symplecticity_defect as symplecticity_defect,
    tangent_projector as tangent_projector,
)
