"""The `geomjax` command (also `python -m geomjax`).

    geomjax list                               the reproducible experiments
    geomjax reproduce NAME [--out DIR]         run one: DIR/NAME.json, PNG figures, a table

Exit codes: 0 on success, 2 on a usage error (including an unknown experiment name),
1 if an experiment raised.
"""

import argparse
import pathlib
import sys
import time


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="geomjax",
        description="Reproduce the experiments of the geomjax seed papers.",
    )
    parser.add_argument("--version", action="version", version=f"geomjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("list", help="list the reproducible experiments")
    rep = sub.add_parser(
        "reproduce",
        help="run an experiment: writes DIR/NAME.json and PNG figures, prints a summary table",
    )
    rep.add_argument("name", metavar="NAME", help="experiment name (see `geomjax list`)")
    rep.add_argument(
        "--out",
        metavar="DIR",
        default="results",
        type=pathlib.Path,
        help="output directory (default: results)",
    )
    rep.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    return parser


def _list() -> int:
    from .experiments import experiments

    table = experiments()
    width = max((len(n) for n in table), default=0)
    for name, exp in table.items():
        print(f"{name.ljust(width)}  {exp.description}")
    return 0


def _reproduce(name: str, out: pathlib.Path, progress: bool) -> int:
    from .experiments import UnknownExperimentError, get, reproduce
    from .experiments._common import format_table

    try:
        get(name)
    except UnknownExperimentError as err:
        print(f"geomjax reproduce: error: {err}", file=sys.stderr)
        return 2
    print(f"reproducing {name!r} into {out}/ ...", flush=True)
    start = time.perf_counter()
    metrics = reproduce(name, out, progress=progress)
    elapsed = time.perf_counter() - start
    if metrics.get("summary"):
        print()
        print(format_table(metrics["summary"]))
        print()
    print(f"metrics: {out / f'{name}.json'}")
    for fig in metrics.get("figures", []):
        print(f"figure:  {out / fig}")
    print(f"done in {elapsed:.1f} s")
    return 0


def main(argv=None) -> int:
    """Entry point of the `geomjax` console script; returns the exit code."""
    args = _parser().parse_args(argv)  # argparse exits with code 2 on usage errors
    if args.command == "list":
        return _list()
    if args.command == "reproduce":
        return _reproduce(args.name, args.out, progress=not args.no_progress)
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    raise SystemExit(main())
