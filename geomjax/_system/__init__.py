"""Systems: Poisson structures, the system types built from user functions, and the
nonholonomic quantities J, C, H_ext that the system, its fields and steps share."""
