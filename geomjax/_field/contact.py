"""The contact Hamiltonian vector field of a `geomjax.ContactHamiltonianSystem`."""

import jax.numpy as jnp

from .._system.contact import ContactHamiltonianSystem, ContactLagrangianSystem
from ..internal.simplify import scalar_graph
from .._validate import trace_user_function
from .base import AbstractField


class ContactField(AbstractField):
    """ẋ = X_H(x) on x = (q, p, s): q̇ = ∂H/∂p, ṗ = −∂H/∂q − p ∂H/∂s, ṡ = p·∂H/∂p − H.

    Built by `geomjax.contact_field(system)`; pieces are (q, p, s) with s a scalar. A
    time-dependent H receives the integration time. Nothing is monitored (H is not
    conserved: dH/dt = −H ∂H/∂s).
    """

    system: ContactHamiltonianSystem

    @property
    def dim(self):
        return self.system.dim

    def split(self, x):
        return self.system.split(x)

    def merge(self, z):
        return self.system.merge(z)

    def rhs(self, t, z, args):
        del args
        if self.system.time_dependent:
            return scalar_graph(lambda zz, tt: self.system.vector_field(*zz, tt), z, jnp.asarray(t, z[0].dtype),
                                enabled=self.simplify)
        return scalar_graph(lambda zz: self.system.vector_field(*zz), z, enabled=self.simplify)

    def check(self, x0) -> None:
        trace_user_function(self, x0, "the contact hamiltonian")


def contact_field(system) -> ContactField:
    """The contact Hamiltonian vector field of a contact system, derived by autodiff.

    On x = (q, p, s) ∈ R²ⁿ⁺¹ with contact form η = ds − p·dq:

        q̇ = ∂H/∂p,   ṗ = −∂H/∂q − p ∂H/∂s,   ṡ = p·∂H/∂p − H,

    the field whose flow satisfies φ*η = ρη (conformally contact) and dH/dt = −H ∂H/∂s.
    For a Herglotz Lagrangian L(q, v, z) it is the field of H(q, p, s) = p·v − L(q, v, s)
    (Legendre transform by autodiff), equivalent to Herglotz' equations.

    **Arguments:**

    - `system`: a `geomjax.ContactHamiltonianSystem`, or a
      `geomjax.ContactLagrangianSystem` (transformed by `to_hamiltonian()`).

    **Returns:**

    A `ContactField`, usable by `geomjax.integrate(field, x0, method=...)` on flat states
    x = (q, p, s).

    Example (the damped pendulum L = v²/2 + cos q − αz, reference by RK4):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> L = lambda q, v, z: 0.5 * v @ v + jnp.cos(q[0]) - 0.2 * z
    >>> field = geomjax.contact_field(geomjax.ContactLagrangianSystem(L, 1))
    >>> field(jnp.array([0.5, 1.0, 0.0]))   # (v, −sin q − αp, p·v − H)
    Array([ 1.        , -0.67942554,  1.37758256], dtype=float64)

    ```
    """
    if isinstance(system, ContactLagrangianSystem):
        system = system.to_hamiltonian()
    if not isinstance(system, ContactHamiltonianSystem):
        raise TypeError(
            "contact_field needs a geomjax.ContactHamiltonianSystem or ContactLagrangianSystem, "
            f"got {type(system).__name__}"
        )
    return ContactField(system)
