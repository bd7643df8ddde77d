"""geomjax: structure-preserving, differentiable integration of constrained mechanics in JAX.

Importing geomjax enables 64-bit floats in JAX (`jax_enable_x64`): the invariants these
methods preserve to round-off are lost in float32.
"""

from . import _config  # noqa: F401  (enables float64 first)
from . import models as models
from ._system.bracket import bracket as bracket
from ._field.hamiltonian import hamiltonian_vector_field as hamiltonian_vector_field
from ._field.dirac import DiracField as DiracField, constraint_matrix as constraint_matrix, dirac_field as dirac_field
from ._field.feedback import AdaptiveFeedbackField as AdaptiveFeedbackField, FeedbackField as FeedbackField
from ._tuning.feedback_field import ChosenGainsWarning as ChosenGainsWarning, feedback_field as feedback_field
from ._stability.analysis import (
    FeedbackAccuracyWarning as FeedbackAccuracyWarning,
    GainCheck as GainCheck,
    check_gains as check_gains,
    feedback_rate as feedback_rate,
    recommended_gains as recommended_gains,
    stability_interval as stability_interval,
)
from ._tuning.tune import TuningResult as TuningResult, feedback_objective as feedback_objective, tune_gains as tune_gains
from ._field.base import AbstractField as AbstractField, TimeField as TimeField
from ._driver.integrate import integrate as integrate
from ._tuning.fit import FIT_RESULTS as FIT_RESULTS, FitError as FitError, FitResult as FitResult, fit as fit
from ._driver.sweep import sweep as sweep
from ._driver.sweep_result import SweepResult as SweepResult
from ._driver.grid import Grid as Grid, product as product, zipped as zipped
from ._step.methods import method_names as method_names, method_order as method_order, register_method as register_method
from ._step.runge_kutta import (
    EULER as EULER,
    HEUN as HEUN,
    KUTTA3 as KUTTA3,
    MIDPOINT as MIDPOINT,
    RK4 as RK4,
    ButcherTableau as ButcherTableau,
    explicit_rk as explicit_rk,
)
from ._driver.solution import (
    FailureDetail as FailureDetail,
    IntegrationError as IntegrationError,
    Solution as Solution,
)
from ._status import RESULTS as RESULTS
from ._caches import clear_caches as clear_caches
from ._step.base import AbstractStep as AbstractStep, FunctionStep as FunctionStep
from ._system.structures import (
    AbstractPoissonStructure as AbstractPoissonStructure,
    PoissonStructure as PoissonStructure,
    canonical as canonical,
    lie_poisson_se2 as lie_poisson_se2,
    lie_poisson_so3 as lie_poisson_so3,
)
from ._system.system import (
    ConstrainedSystem as ConstrainedSystem,
    HamiltonianSystem as HamiltonianSystem,
    HolonomicSystem as HolonomicSystem,
    NonholonomicSystem as NonholonomicSystem,
    System as System,
)
from ._system.bundles import left_trivialised_se2 as left_trivialised_se2, left_trivialised_so3 as left_trivialised_so3
from ._field.nonholonomic import (
    NonholonomicFeedbackField as NonholonomicFeedbackField,
    NonholonomicField as NonholonomicField,
    embedding_defect as embedding_defect,
    nonholonomic_field as nonholonomic_field,
    nonholonomic_quantities as nonholonomic_quantities,
    project_nonholonomic as project_nonholonomic,
)
from ._step.dla import dla as dla, discrete_lagrange_dalembert as discrete_lagrange_dalembert
from ._solve.newton import Newton as Newton, NewtonResult as NewtonResult
from ._step.rattle import rattle as rattle, shake as shake
from ._step.splitting import (
    compose as compose,
    lie_trotter as lie_trotter,
    strang as strang,
    triple_jump as triple_jump,
    triple_jump_coefficients as triple_jump_coefficients,
)
from ._step.implicit_rk import (  # importing registers "implicit_midpoint", "gauss2/4/6", "trapezoidal"
    GAUSS2 as GAUSS2,
    GAUSS4 as GAUSS4,
    GAUSS6 as GAUSS6,
    GAUSS8 as GAUSS8,
    IMPLICIT_MIDPOINT as IMPLICIT_MIDPOINT,
    TRAPEZOIDAL as TRAPEZOIDAL,
    ImplicitTableau as ImplicitTableau,
    implicit_rk as implicit_rk,
)
from ._step.projection import project as project, project_holonomic as project_holonomic
from ._system.velocity_constraints import VelocityConstraint as VelocityConstraint
from ._system.lagrangian import LagrangianSystem as LagrangianSystem
from ._system.contact import (
    ContactHamiltonianSystem as ContactHamiltonianSystem,
    ContactLagrangianSystem as ContactLagrangianSystem,
)
from ._field.contact import ContactField as ContactField, contact_field as contact_field
from ._field.lagrangian import (
    LagrangeDAlembertField as LagrangeDAlembertField,
    lagrange_dalembert_field as lagrange_dalembert_field,
)
from ._system.discrete import DiscreteLagrangian as DiscreteLagrangian, discrete_lagrangian as discrete_lagrangian
from ._step.variational import (
    ForcedDLAStep as ForcedDLAStep,
    HerglotzStep as HerglotzStep,
    forced_dla as forced_dla,
    herglotz as herglotz,
)
from ._step.contact_splitting import ContactSplittingStep as ContactSplittingStep, contact_splitting as contact_splitting
from ._system.implicit import ImplicitLagrangian as ImplicitLagrangian
from ._step.dirac import DiracStep as DiracStep, dirac as dirac, dirac1 as dirac1, dirac2 as dirac2
from ._step.multistep import (  # importing registers "ab2", "ab3", "ab4"
    AdamsBashforth as AdamsBashforth,
    adams_bashforth as adams_bashforth,
)
from . import diagnostics as diagnostics
# Dirac–Runge–Kutta
from ._step.dirac_rk import DiracRungeKutta as DiracRungeKutta, DiracStages as DiracStages, dirac_rk as dirac_rk
from ._step.partitioned_tableau import PartitionedTableau as PartitionedTableau
# order conditions
from ._analysis.taylor import (
    OrderCondition as OrderCondition,
    Polynomial as Polynomial,
    exact_flow as exact_flow,
    order_conditions as order_conditions,
    random_polynomial as random_polynomial,
    reduce_conditions as reduce_conditions,
    series_root as series_root,
    solve_conditions as solve_conditions,
    taylor_coefficients as taylor_coefficients,
)

# learning constrained dynamics from data
from ._learning.networks import (
    ConstrainedHamiltonianNetwork as ConstrainedHamiltonianNetwork,
    NeuralODE as NeuralODE,
    parameter_count as parameter_count,
)
from ._learning.training import (
    network_gains as network_gains,
    relative_error as relative_error,
    rollout as rollout,
    rollout_error as rollout_error,
    rollout_loss as rollout_loss,
    train as train,
)
from .models._trajectories import Trajectories as Trajectories
from .models._chain_data import chain_trajectories as chain_trajectories

from ._version import __version__ as __version__


def __getattr__(name):
    # `StepSolver` subclasses a diffrax class: diffrax is imported on first use, not with
    # geomjax (it is a third of geomjax's import time).
    if name == "StepSolver":
        from ._driver.diffrax_adapter import StepSolver

        return StepSolver
    raise AttributeError(f"module 'geomjax' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + ["StepSolver"])
