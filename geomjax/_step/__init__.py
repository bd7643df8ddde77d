"""One-step maps: explicit and implicit Runge–Kutta, RATTLE/SHAKE, splitting, projection, DLA."""
