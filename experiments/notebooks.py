"""Execute the results (and quick method) notebooks in place, so that a fresh clone shows their tables and figures
without running a cell.

    MATRYOSHKA_LAB_DATA=../shared/data python experiments/notebooks.py        # every notebook of RESULT_NOTEBOOKS
    MATRYOSHKA_LAB_DATA=../shared/data python experiments/notebooks.py nbs/studies/03_mipic_mic.ipynb

Each notebook runs top to bottom in a fresh python3 kernel started in its folder, with the data directory of
$MATRYOSHKA_LAB_DATA (or --data) and progress bars off (TQDM_DISABLE); its experiments read their committed result
files under results/ instead of re-running. nbdev_clean then strips the volatile metadata (execution counts, kernel
state) and keeps the outputs. `--check` executes into a temporary copy instead and fails when any output differs
from the committed one: the outputs depend on the result files and the code alone.
"""
from __future__ import annotations

import argparse
import os
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
                same = outputs(dest) == outputs(path)
            differ += [] if same else [path.name]
            print(f"{path.name}: {seconds:.0f} s, outputs {'as committed' if same else 'DIFFER from the committed ones'}")
        else:
            print(f"{path.name}: {execute(path, path):.0f} s, outputs written")
    if differ:
        sys.exit(f"outputs differ: {', '.join(differ)} (re-run without --check and commit, or find what is not deterministic)")


if __name__ == "__main__":
    main()
