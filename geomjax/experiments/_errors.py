"""The error the experiments raise for an option value they refuse (a leaf module)."""


class ExperimentOptionError(ValueError):
    """Raised for an option an experiment does not accept, or a bad option value; the
    message names the experiment and the options it accepts."""
