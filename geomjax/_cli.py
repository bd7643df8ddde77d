"""The `geomjax` command (also `python -m geomjax`).

    geomjax list                                   the experiments and the options each takes
    geomjax reproduce NAME [--out DIR] [OPTIONS]   run one: DIR/NAME.json, DIR/NAME.npz, PNG figures, a table
    geomjax reproduce --all [--out DIR]            run every experiment in turn

OPTIONS are `--dt H`, `--t-final T`, `--gains K[,K...]` (on the experiments that declare
them; `geomjax list` shows which) and `--quick` (every experiment: a tiny configuration for
a smoke test, whose numbers are not the paper's).

Exit codes: 0 on success, 2 on a usage error (an unknown experiment name, an option the
experiment does not take, a bad option value), 1 if an experiment raised.
"""

import argparse
import pathlib
import sys
import time
import traceback


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    from .experiments import OPTIONS, experiments

    parser = argparse.ArgumentParser(
        prog="geomjax",
        description="Reproduce the experiments of the geomjax papers.",
    )
    parser.add_argument("--version", action="version", version=f"geomjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("list", help="list the reproducible experiments and the options each takes")
    rep = sub.add_parser(
        "reproduce",
        help="run an experiment: writes DIR/NAME.json, DIR/NAME.npz and PNG figures, prints a summary table",
        description="Run an experiment (or all of them): writes DIR/NAME.json (metrics), DIR/NAME.npz (the "
        "arrays drawn in the figures) and the PNG figures, and prints a summary table.",
        epilog="experiments taking options:\n"
        + "\n".join(f"  {n}: {e.accepted()}" for n, e in experiments().items() if e.options)
        + "\nevery experiment takes --quick.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("name", metavar="NAME", nargs="?", help="experiment name (see `geomjax list`)")
    rep.add_argument("--all", action="store_true", help="run every experiment, one after the other")
    rep.add_argument(
        "--out",
        metavar="DIR",
        default="results",
        type=pathlib.Path,
        help="output directory (default: results)",
    )
    rep.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    rep.add_argument(
        "--quick",
        action="store_true",
        help="a tiny configuration (short horizon, few step sizes) that draws every figure in seconds; "
        "for smoke tests, not the paper's numbers",
    )
    for option in OPTIONS.values():
        takers = [n for n, e in experiments().items() if option.name in e.options]
        rep.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar,
            default=None,
            help=f"{option.help} (taken by: {', '.join(takers) or 'none'})",
        )
    return parser


def _list() -> int:
    from .experiments import experiments

    table = experiments()
    width = max((len(n) for n in table), default=0)
    for name, exp in table.items():
        print(f"{name.ljust(width)}  {exp.description}")
        if exp.options:
            print(f"{''.ljust(width)}  options: {exp.accepted()}")
    return 0


def _error(message: str) -> int:
    print(f"geomjax reproduce: error: {message}", file=sys.stderr)
    return 2


def _run_one(name: str, out: pathlib.Path, progress: bool, quick: bool, options: dict) -> None:
    from .experiments import reproduce
    from .experiments._columns import format_legend
    from .experiments._common import format_table

    print(f"reproducing {name!r} into {out}/ ...", flush=True)
    start, cpu = time.perf_counter(), time.process_time()
    metrics = reproduce(name, out, progress=progress, quick=quick, **options)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if metrics.get("summary"):
        print()
        print(format_table(metrics["summary"]))
        print()
        print("columns:")
        print(format_legend(metrics["summary"]))
        print()
    for line in metrics.get("findings", []):
        print(f"- {line}")
    if metrics.get("findings"):
        print()
    print(f"metrics: {out / f'{name}.json'}")
    print(f"arrays:  {out / metrics['arrays']}")
    for fig in metrics.get("figures", []):
        print(f"figure:  {out / pathlib.Path(fig).name}")
    # CPU time (all threads of this process) is close to the wall time on an idle machine
    # and much less affected by other load.
    print(f"done in {elapsed:.1f} s (CPU time {cpu:.1f} s)", flush=True)


def _reproduce(args) -> int:
    from .experiments import OPTIONS, ExperimentOptionError, UnknownExperimentError, check_options, names

    if args.all == (args.name is not None):
        return _error("give one experiment NAME or --all (see `geomjax list`)")
    options = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    try:
        chosen = names() if args.all else [args.name]
        refused = []
        for name in chosen:
            try:
                check_options(name, options)
            except ExperimentOptionError as err:
                refused.append(str(err))
        if refused:
            prefix = "with --all the options go to every experiment: " if args.all else ""
            return _error(prefix + "; ".join(refused))
    except UnknownExperimentError as err:
        return _error(str(err))
    failed = []
    for name in chosen:
        try:
            _run_one(name, args.out, not args.no_progress, args.quick, options)
        except ExperimentOptionError as err:  # an option value the experiment's setup refuses
            if not args.all:
                return _error(f"experiment {name!r}: {err}")
            print(f"geomjax reproduce: error: experiment {name!r}: {err}", file=sys.stderr)
            failed.append(name)
        except Exception:
            if not args.all:
                raise
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """Entry point of the `geomjax` console script; returns the exit code."""
    args = _parser().parse_args(argv)  # argparse exits with code 2 on usage errors
    if args.command == "list":
        return _list()
    if args.command == "reproduce":
        return _reproduce(args)
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    raise SystemExit(main())
