"""Numerical and compiler configuration applied when geomjax is imported.

- 64-bit floats: geomjax switches JAX to float64 (``jax_enable_x64``) on import: the
  invariants that structure-preserving methods keep to round-off are lost at float32
  precision. Import geomjax before creating any array that should be float64.

- Small loops as one kernel on the CPU: XLA's CPU runtime compiles a `while` loop into a
  single function when the bytes its body touches stay under a threshold (1 KiB by
  default), and otherwise launches every fused kernel of the body separately, each
  with its own overhead, on every iteration. The loops of one trajectory of a small
  mechanical system sit just around 1 KiB: a field with a few more parameters, a loop
  that saves every step, or the backward loop of reverse mode crosses it, and then runs
  many times slower (`benchmarks/gradients.py`: the spherical pendulum's feedback
  field, reverse mode and a run saving every step). geomjax raises the threshold to
  `SMALL_LOOP_BYTES` by adding ``xla_cpu_small_while_loop_byte_threshold`` to the
  ``XLA_FLAGS`` environment variable, which XLA reads when its CPU backend starts: so
  it takes effect only if geomjax is imported before JAX first computes anything. A
  threshold already present in ``XLA_FLAGS`` is left as it is, and setting
  ``GEOMJAX_XLA_FLAGS=0`` leaves ``XLA_FLAGS`` untouched. Batched loops (``vmap`` over
  many states) touch more bytes than the threshold and run as before.
"""

import os

import jax

#: The loop size (bytes touched by one iteration) below which XLA's CPU backend compiles
#: a loop into one function, as geomjax sets it.
SMALL_LOOP_BYTES = 65536

_THRESHOLD_OPTION = "xla_cpu_small_while_loop_byte_threshold"
_EXTRA_OPTIONS_FLAG = "--xla_backend_extra_options="


def with_backend_option(flags: str, option: str, value) -> str:
    """`XLA_FLAGS` with the backend option ``option=value`` added to
    ``--xla_backend_extra_options`` (merged into the last occurrence, the one XLA keeps);
    `flags` unchanged when it already names `option`.

    Example:

    ```python
    >>> from geomjax._config import with_backend_option
    >>> with_backend_option("--xla_dump_to=/tmp", "xla_cpu_use_multi_output_fusion", "true")
    '--xla_dump_to=/tmp --xla_backend_extra_options=xla_cpu_use_multi_output_fusion=true'

    ```
    """
    if option in flags:
        return flags
    entry = f"{option}={value}"
    parts = flags.split()
    for i in reversed(range(len(parts))):
        if parts[i].startswith(_EXTRA_OPTIONS_FLAG):
            parts[i] = f"{parts[i]},{entry}"
            return " ".join(parts)
    return " ".join(parts + [_EXTRA_OPTIONS_FLAG + entry])


def with_small_loop_threshold(flags: str, threshold: int = SMALL_LOOP_BYTES) -> str:
    """`XLA_FLAGS` with the small-loop threshold added (`with_backend_option`; a threshold
    already there is kept).

    Example:

    ```python
    >>> from geomjax._config import with_small_loop_threshold
    >>> with_small_loop_threshold("--xla_dump_to=/tmp", 4096)
    '--xla_dump_to=/tmp --xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=4096'
    >>> with_small_loop_threshold("--xla_backend_extra_options=a=1", 4096)
    '--xla_backend_extra_options=a=1,xla_cpu_small_while_loop_byte_threshold=4096'

    ```
    """
    return with_backend_option(flags, _THRESHOLD_OPTION, threshold)


if os.environ.get("GEOMJAX_XLA_FLAGS", "1") != "0":
    os.environ["XLA_FLAGS"] = with_small_loop_threshold(os.environ.get("XLA_FLAGS", ""))

jax.config.update("jax_enable_x64", True)
