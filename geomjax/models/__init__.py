"""Reference problems from the seed papers, each a system with parameters and an initial state."""

from ._model import Model as Model
from ._pendulum import planar_pendulum as planar_pendulum, spherical_pendulum as spherical_pendulum
