"""The XLA flags the test suite compiles with, set in XLA_FLAGS when tests/conftest.py
imports this module (before JAX starts its CPU backend, which reads them once).

Most tests compile far more than they run: without XLA's backend optimisation passes the
CPU backend compiles 2-3x faster (the whole suite: 5 min 20 s instead of 6-7 min on 2
cores), and the arithmetic is the same program's. The CPU backend's older fusion emitters
(LLVM IR written directly instead of through MLIR), one LLVM module per program instead
of pieces compiled in parallel, and no expensive LLVM passes take about a third less CPU
again (the whole suite in one process: 576 s instead of 940 s of user time); none of them
is a fast-math option. GEOMJAX_TEST_OPTIMIZE=1 runs the suite on fully optimised code with
XLA's default emitters instead (benchmarks and experiments always are).

Decided once, by the first process (pytest, or xdist's controller), and inherited by the
xdist workers through the environment. XLA aborts a process whose XLA_FLAGS name a flag it
does not know (one a later jaxlib drops): a child process (under a second) tries the
faster flags first, and without them the suite runs with the optimisation level alone.
"""

import os
import subprocess
import sys

FAST_COMPILE_FLAGS = (
    "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1 --xla_llvm_disable_expensive_passes=true"
)


def _xla_accepts(flags: str) -> bool:
    probe = "import jax; jax.numpy.zeros(1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


if os.environ.get("GEOMJAX_TEST_OPTIMIZE", "0") != "1" and "GEOMJAX_TEST_XLA_FLAGS" not in os.environ:
    _flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    if _xla_accepts(f"{_flags} {FAST_COMPILE_FLAGS}"):
        _flags = f"{_flags} {FAST_COMPILE_FLAGS}"
    os.environ["XLA_FLAGS"] = os.environ["GEOMJAX_TEST_XLA_FLAGS"] = _flags
