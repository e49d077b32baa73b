"""A new workbench session on a runs root holding one very large run: the cost of opening another run's page.

    python bench/session_open.py [--mb 64] [--rounds 5] [--out results/bench/session_open.json]

Issue 59's probe 15: with a large metrics.jsonl among the runs, every new session of the workbench parsed the first
32 MB of the first two runs (the Compare tab's default pair) while building, on the server thread. Compare now reads
its runs when the tab is first shown (or a Compare picker changes). In one process, on one runs root (`big`: --mb of
records, `small`: 300 steps), alternately each round:
  open           build_app(root, run="small"), what a session opened at ?run=small builds now;
  open+compare   the same, then the comparison the session used to make while building (Workbench.compare()).
Figures are medians over --rounds; the last line is one JSON object; --out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from matryoshka_lab.core import provenance
from matryoshka_lab.runs import RunLog, write_json
from matryoshka_lab.workbench import build_app


def write_run(folder: Path, steps: int, per_step: int) -> int:
    "A run of `steps` steps of `per_step` eval records each (a grid's worth); its metrics.jsonl size in bytes."
    log = RunLog(folder, config={"method": "mrl"})
    for s in range(1, steps + 1):
        log.log(s, "loss", 1.0 / s)
        log.log_many(s, {f"stsb/L{l}/d{d}/spearman": 50 + l + d / 1000 for l in range(7) for d in (16, 32, 64, 128, 256, 384)},
                     split="eval")
        if per_step > 1:
            log.log_many(s, {f"diag/x{i}": float(i) for i in range(per_step)})
    log.close()
    return (folder / "metrics.jsonl").stat().st_size


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    made = provenance("python bench/session_open.py " + shlex.join(sys.argv[1:]))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        per_step = 200
        size = write_run(root / "big", 1, per_step)                 # one step's bytes, then enough steps for --mb
        size = write_run(root / "big", max(1, args.mb * (1 << 20) // size), per_step)
        write_run(root / "small", 300, 1)
        times = {"open": [], "open+compare": []}
        for r in range(args.rounds):
            for key in (list(times) if r % 2 == 0 else list(times)[::-1]):
                t0 = time.perf_counter()
                wb = build_app(root, run="small")
                if key == "open+compare":
                    wb.compare()
                times[key].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        result = {"big_run_mb": round(size / (1 << 20), 1), "rounds": args.rounds,
                  "median_s": {k: round(v, 3) for k, v in med.items()},
                  "open_compare_over_open": round(med["open+compare"] / med["open"], 2), "seconds": times}
    print(f"runs root with a {result['big_run_mb']} MB run: a session at ?run=small builds in {med['open']:.2f} s; "
          f"with the comparison made while building (before), {med['open+compare']:.2f} s "
          f"({result['open_compare_over_open']}x)")
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}))
    if args.out:
        write_json(args.out, {**made, **result})


if __name__ == "__main__":
    main()
