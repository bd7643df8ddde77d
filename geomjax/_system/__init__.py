"""Systems: Poisson structures and the system types built from user functions."""
