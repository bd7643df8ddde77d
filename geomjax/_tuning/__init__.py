"""Fitting to data and tuning by gradients: the parameters of a system to observed trajectories (`fit`), the gains of a feedback field to an objective of its runs (`tune_gains`)."""
