"""geomjax: structure-preserving, differentiable integration of constrained mechanics in JAX.

Importing geomjax enables 64-bit floats in JAX (`jax_enable_x64`): the invariants these
methods preserve to round-off are lost in float32.
"""

from . import _config  # noqa: F401  (enables float64 first)
from . import models as models
from ._bracket import bracket as bracket, hamiltonian_vector_field as hamiltonian_vector_field
from ._diffrax_adapter import StepSolver as StepSolver
from ._dirac import DiracField as DiracField, constraint_matrix as constraint_matrix, dirac_field as dirac_field
from ._feedback import FeedbackField as FeedbackField, feedback_field as feedback_field
from ._field import AbstractField as AbstractField
from ._integrate import integrate as integrate
from ._methods import method_names as method_names, method_order as method_order, register_method as register_method
from ._runge_kutta import (
    EULER as EULER,
    HEUN as HEUN,
    KUTTA3 as KUTTA3,
    MIDPOINT as MIDPOINT,
    RK4 as RK4,
    ButcherTableau as ButcherTableau,
    explicit_rk as explicit_rk,
)
from ._solution import IntegrationError as IntegrationError, Solution as Solution
from ._step import AbstractStep as AbstractStep, FunctionStep as FunctionStep
from ._structures import (
    AbstractPoissonStructure as AbstractPoissonStructure,
    PoissonStructure as PoissonStructure,
    canonical as canonical,
    lie_poisson_se2 as lie_poisson_se2,
    lie_poisson_so3 as lie_poisson_so3,
)
from ._system import System as System

__version__ = "0.1.0"
