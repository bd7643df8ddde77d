"""Reference problems from the papers, each a system with parameters and an initial state."""

from ._model import Model as Model
from ._chain import planar_chain as planar_chain
from ._spatial_chain import spatial_chain as spatial_chain
from ._rigid_bodies import RigidBodies as RigidBodies, angular_momentum as angular_momentum
from ._rigid_models import gyroscope as gyroscope, gyroscope_trajectories as gyroscope_trajectories, rotor as rotor
from ._rod_networks import cloth as cloth, rod_ring as rod_ring, rod_tree as rod_tree, water_box as water_box
from ._pendulum import planar_pendulum as planar_pendulum, spherical_pendulum as spherical_pendulum
from ._pendulum_flows import pendulum_flows as pendulum_flows
from ._nonholonomic import (
    heisenberg as heisenberg,
    knife_edge as knife_edge,
    nonholonomic_oscillator as nonholonomic_oscillator,
    vertical_disk as vertical_disk,
)
from ._nonholonomic_groups import chaplygin_sleigh as chaplygin_sleigh, roller_racer as roller_racer, suslov as suslov
from ._feedback_paper import (
    FeedbackModel as FeedbackModel,
    kepler as kepler,
    kepler_flows as kepler_flows,
    perturbed_kepler as perturbed_kepler,
    rigid_body as rigid_body,
    rigid_body_flows as rigid_body_flows,
)
from ._damped import DampedModel as DampedModel, damped_foucault as damped_foucault, damped_oscillator as damped_oscillator
from ._dirac import (
    LagrangianModel as LagrangianModel,
    cartesian_pendulum as cartesian_pendulum,
    column_angles as column_angles,
    column_state as column_state,
    pendulum_state as pendulum_state,
    ziegler_column as ziegler_column,
)
