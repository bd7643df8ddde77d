"""Learning from data: physical parameters fitted to observed trajectories."""
