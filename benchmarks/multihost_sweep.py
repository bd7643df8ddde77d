"""A sweep over several processes (hosts) with `jax.distributed`, checked against one process.

On a cluster, run the same command on every host with its own `--process-id` and the
address of process 0 (or `--auto` where `jax.distributed.initialize()` finds them itself:
SLURM, Open MPI, Cloud TPU):

    python benchmarks/multihost_sweep.py --process-id 0 --processes 2 --coordinator host0:12355
    python benchmarks/multihost_sweep.py --process-id 1 --processes 2 --coordinator host0:12355

Every process builds the same grid; `geomjax.sweep(..., devices=jax.devices())` shards the
members over all devices of all processes (one mesh axis, "members"): each process
computes the members on its own devices, and the results are gathered on every process.

Without `--process-id` the script runs the whole thing on this machine: it starts
`--processes` local processes with `--devices-per-process` CPU devices each (CPU
collectives over gloo), then runs the same sweep in one process on one device and compares
statuses (equal) and the states of the members that succeeded (to 1e-10 relative to
1 + |x|: gains up to 2e4 make the feedback terms round to ~1e-12). Run: `python benchmarks/multihost_sweep.py`.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def member(g, gain):
    import geomjax

    model = geomjax.models.spherical_pendulum(g=g)
    return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0


def grid():
    import numpy as np

    import geomjax

    # gains up to 2e4 with dt = 1e-3: past explicit Euler's stability limit, some members diverge
    return geomjax.product(g=np.linspace(1.0, 10.0, 6), gain=np.logspace(0, 4.3, 10))


def run_sweep(devices, steps):
    import geomjax

    start = time.perf_counter()
    result = geomjax.sweep(member, grid(), dt=1e-3, steps=steps, save_every=steps // 4, devices=devices)
    result.xs.block_until_ready()
    return result, time.perf_counter() - start


def worker(args):
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_process} " + os.environ.get("XLA_FLAGS", "")
    import jax

    if args.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.auto:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes, process_id=args.process_id)
    result, seconds = run_sweep(jax.devices(), args.steps)
    if jax.process_index() == 0:
        print(
            f"{jax.process_count()} processes, {len(jax.devices())} devices: {result.summary()} "
            f"in {seconds:.2f} s (compilation included)"
        )
        if args.out:
            result.save(args.out)


def launch(args):
    """Start the processes here, then compare their result with a one-process sweep."""
    import numpy as np

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "multihost")
    command = [sys.executable, __file__, "--processes", str(args.processes), "--coordinator", f"localhost:{port}",
               "--devices-per-process", str(args.devices_per_process), "--steps", str(args.steps), "--cpu-collectives"]
    procs = [
        subprocess.Popen(command + ["--process-id", str(i)] + (["--out", out] if i == 0 else []))
        for i in range(args.processes)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        sys.exit(f"a process failed (exit codes {codes})")
    import geomjax

    many = geomjax.SweepResult.load(out)
    one, seconds = run_sweep(None, args.steps)
    print(f"1 process, 1 device: {one.summary()} in {seconds:.2f} s (compilation included)")
    same_status = np.array_equal(np.asarray(many.status), np.asarray(one.status))
    a, b = np.asarray(many.xs), np.asarray(one.xs)
    rel = np.abs(a - b) / (1.0 + np.abs(b))
    ok = np.asarray(one.ok)
    gap = float(np.nanmax(rel[ok]))
    print(f"members that succeeded: largest relative difference {gap:.1e}; members that diverged "
          f"(round-off amplified by the instability until they stop): {float(np.nanmax(rel[~ok])):.1e}")
    same_nan = np.array_equal(np.isnan(np.asarray(many.xs)), np.isnan(np.asarray(one.xs)))
    print(f"statuses equal: {same_status}; NaN saves equal: {same_nan}")
    # The feedback terms k·(I(x) − I(x0)) round to about k·ε: with gains up to 2e4 the
    # members' states carry ~1e-12 of rounding that depends on how XLA fused each program
    # (a shard of 15 members vs 60), not on where it ran.
    if not (same_status and same_nan and gap <= 1e-10):
        sys.exit("the multi-process sweep differs from the one-process sweep")
    print("multi-process sweep equals the one-process sweep")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, help="this process's index (omit to launch all locally)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--coordinator", default=None, help="host:port of process 0")
    parser.add_argument("--auto", action="store_true", help="let jax.distributed.initialize() find the cluster")
    parser.add_argument("--devices-per-process", type=int, default=2, help="CPU devices per local process")
    parser.add_argument("--cpu-collectives", action="store_true", help="CPU collectives over gloo (CPU-only runs)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default=None, help="save process 0's result here (npz + json)")
    args = parser.parse_args(argv)
    if args.process_id is None and not args.auto:
        launch(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
