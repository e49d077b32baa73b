"""Execute the results (and quick method) notebooks in place, so that a fresh clone shows their tables and figures
without running a cell.

    MATRYOSHKA_LAB_DATA=../shared/data python experiments/notebooks.py        # every notebook of RESULT_NOTEBOOKS
    MATRYOSHKA_LAB_DATA=../shared/data python experiments/notebooks.py nbs/studies/03_mipic_mic.ipynb

Each notebook runs top to bottom in a fresh python3 kernel started in its folder, with the data directory of
$MATRYOSHKA_LAB_DATA (or --data) and progress bars off (TQDM_DISABLE); its experiments read their committed result
files under results/ instead of re-running. nbdev_clean then strips the volatile metadata (execution counts, kernel
state) and keeps the outputs. `--check` executes into a temporary copy instead and fails when any output differs
from the committed one: the outputs depend on the result files and the code alone, up to float noise (a number may
move by RTOL relative, or by one unit of its last printed digit: another CPU sums in another order, and what a
notebook trains moves in its fifth digit).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
# the notebooks committed with their outputs (each under three minutes on 2 cores): the results notebooks, which read
# results/, the method notebooks whose checks print what they compare, and the tutorial (its last section reads results/)
RESULT_NOTEBOOKS = ("07_losses.ipynb", "08_diagnostics.ipynb", "14_stats.ipynb", "15_mipic.ipynb", "16_mic.ipynb",
                    "17_distill.ipynb", "18_fractal.ipynb", "19_fractal_runner.ipynb", "20_routing.ipynb",
                    "25_your_method.ipynb", "studies/02_baselines.ipynb", "studies/03_mipic_mic.ipynb",
                    "studies/04_fractal.ipynb", "studies/05_distill.ipynb", "studies/06_report.ipynb")


def execute(path: Path, dest: Path, timeout: int = 1800) -> float:
    "Run the notebook at path top to bottom (kernel cwd: path's folder), write it with its outputs to dest, nbdev_clean it; the seconds it took."
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", coalesce_streams=True,   # one output per print run
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nbformat.write(nb, dest)
    subprocess.run(["nbdev_clean", "--fname", str(dest)], cwd=ROOT, check=True)
    return seconds


def outputs(path: Path) -> list:
    "Each code cell's outputs, in order."
    return [c.get("outputs", []) for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")
RTOL = 1e-4   # seen across two CPUs: a trained tiny model's Spearman x100 76.443 / 76.439, a loss 203.676 / 203.677


def _close_numbers(x: str, y: str) -> bool:
    "Two printed numbers within RTOL, or one unit of the last digit printed (a rounding that flips)."
    unit = 0.0 if "e" in x + y else 10.0 ** -max(len(s.split(".")[1]) for s in (x, y))
    return math.isclose(float(x), float(y), rel_tol=RTOL, abs_tol=1.01 * unit)


DATASET = re.compile(r"data-[0-9a-f]{32}")   # altair's name of a chart's inline data: a hash of the data itself


def same_outputs(a, b) -> bool:
    "Outputs equal but for float noise: texts whose numbers are close (_close_numbers), floats (a Vega-Lite spec's data) within RTOL, altair's dataset names (hashes of that data) as one."
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = ({DATASET.sub("data-#", k): v for k, v in o.items()} for o in (a, b))
        return a.keys() == b.keys() and all(same_outputs(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_outputs, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=RTOL) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        a, b = DATASET.sub("data-#", a), DATASET.sub("data-#", b)
        xs, ys = NUMBER.findall(a), NUMBER.findall(b)
        return NUMBER.split(a) == NUMBER.split(b) and len(xs) == len(ys) and all(map(_close_numbers, xs, ys))
    return a == b


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", type=Path, help=f"default: nbs/ + each of {', '.join(RESULT_NOTEBOOKS)}")
    p.add_argument("--data", default=os.environ.get("MATRYOSHKA_LAB_DATA"),
                   help="the data directory (default $MATRYOSHKA_LAB_DATA); without one the notebooks show their quick plumbing runs")
    p.add_argument("--check", action="store_true", help="execute into a temporary copy and compare outputs with the committed ones")
    args = p.parse_args()
    if not args.data:
        p.error("no data directory: pass --data or set MATRYOSHKA_LAB_DATA (the committed outputs are those of the real data)")
    os.environ.update(MATRYOSHKA_LAB_DATA=str(Path(args.data).resolve()), TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    os.environ.pop("IN_TEST", None)
    paths = [p.resolve() for p in args.notebooks] or [ROOT / "nbs" / name for name in RESULT_NOTEBOOKS]
    differ = []
    for path in paths:
        if not path.is_file():
            sys.exit(f"no notebook {str(path)!r}")
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                dest = Path(tmp) / path.name
                seconds = execute(path, dest)
                same = same_outputs(outputs(dest), outputs(path))
            differ += [] if same else [path.name]
            print(f"{path.name}: {seconds:.0f} s, outputs {'as committed' if same else 'DIFFER from the committed ones'}")
        else:
            print(f"{path.name}: {execute(path, path):.0f} s, outputs written")
    if differ:
        sys.exit(f"outputs differ: {', '.join(differ)} (re-run without --check and commit, or find what is not deterministic)")


if __name__ == "__main__":
    main()
