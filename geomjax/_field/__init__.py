"""Vector fields derived from systems: Hamiltonian, Dirac, feedback, nonholonomic."""
