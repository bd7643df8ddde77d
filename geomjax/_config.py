"""Numerical configuration applied when geomjax is imported.

geomjax switches JAX to 64-bit floats (``jax_enable_x64``) on import: the invariants that
structure-preserving methods keep to round-off are lost at float32 precision. Import
geomjax before creating any array that should be float64.
"""

import jax

jax.config.update("jax_enable_x64", True)
