"""Regenerate the figures of the documentation's Experiments page.

Runs `geomjax reproduce NAME` for every experiment that `geomjax list` shows (or the ones
named on the command line), each in a fresh process, into a work directory, and copies
what the page shows into `docs/figures/NAME/`:

- the PNG figures, scaled down to at most `--max-width` pixels and re-encoded with an
  adaptive palette (the plots are line art, so this keeps them legible and small);
- `summary.json`: the experiment's summary table (the `"summary"` rows of its metrics)
  and its wall time;

and writes `docs/figures/experiments.json`, every experiment's name and description as
`geomjax list` shows them (the page lists experiments from it).

A figure directory is replaced only when its experiment succeeded, so a failed or
interrupted run leaves the previous figures in place. Usage, from the repository root:

    python docs/generate_figures.py                       # every experiment
    python docs/generate_figures.py kepler suslov         # just these
    python docs/generate_figures.py --work /tmp/geomjax-figures --jobs 2
    python docs/generate_figures.py kepler -- --some-option    # passed to `geomjax reproduce`

The log of each run is kept in the work directory (`NAME.log`).
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"


def list_experiments() -> dict[str, str]:
    """What `geomjax list` prints: experiment name -> one-line description, in its order."""
    out = subprocess.run(
        [sys.executable, "-m", "geomjax", "list"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    # an experiment's row starts at the margin; indented lines continue it (its options)
    rows = (line.split(maxsplit=1) for line in out.splitlines() if line.strip() and not line[0].isspace())
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


def shrink_png(source: pathlib.Path, target: pathlib.Path, max_width: int) -> None:
    """Copy a PNG, scaled to at most `max_width` pixels wide and palette-encoded."""
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with matplotlib; without it, copy as is
        shutil.copyfile(source, target)
        return
    with Image.open(source) as image:
        image = image.convert("RGB")
        if image.width > max_width:
            height = round(image.height * max_width / image.width)
            image = image.resize((max_width, height), Image.LANCZOS)
        image = image.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        image.save(target, optimize=True)


def reproduce(name: str, work: pathlib.Path, max_width: int, extra: list[str]) -> tuple[str, bool, float]:
    """Run one experiment in a fresh process; on success replace docs/figures/NAME."""
    out = work / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    start = time.perf_counter()
    with open(work / f"{name}.log", "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "geomjax", "reproduce", name, "--out", str(out), "--no-progress", *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return name, False, seconds
    metrics = json.loads((out / f"{name}.json").read_text())
    target = FIGURES / name
    staging = FIGURES / f".{name}.new"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for png in sorted(out.glob("*.png")):
        shrink_png(png, staging / png.name, max_width)
    summary = {"summary": metrics.get("summary", []), "seconds": round(seconds, 1)}
    (staging / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return name, True, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="experiments to run (default: all)")
    parser.add_argument("--work", type=pathlib.Path, help="work directory (default: a new temporary one)")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run at once (default 1)")
    parser.add_argument("--max-width", type=int, default=900, help="largest figure width in pixels")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    known = list_experiments()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown experiments {unknown}; `geomjax list` shows {list(known)}")
    names = args.names or list(known)
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="geomjax-figures-"))
    work.mkdir(parents=True, exist_ok=True)
    FIGURES.mkdir(parents=True, exist_ok=True)
    # The Experiments page lists every registered experiment from this file.
    (FIGURES / "experiments.json").write_text(json.dumps(known, indent=1, ensure_ascii=False) + "\n")
    print(f"running {len(names)} experiments into {work} (logs: {work}/NAME.log)", flush=True)

    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, ok, seconds in pool.map(lambda n: reproduce(n, work, args.max_width, extra), names):
            print(f"{'ok    ' if ok else 'FAILED'} {name:32s} {seconds:7.1f} s", flush=True)
            if not ok:
                failed.append(name)
    size = sum(p.stat().st_size for p in FIGURES.rglob("*.png"))
    print(f"docs/figures: {size / 1e6:.2f} MB of PNG", flush=True)
    if failed:
        print(f"failed (see their logs in {work}): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
