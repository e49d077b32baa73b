"""Fractal heads one process at a time vs `workers` processes at a time, side by side on the same cached vectors.

    python bench/fractal_workers.py [--data-dir DIR] [--max-train 2000] [--seeds 2] [--workers 2] [--rounds 2]
                                    [--out results/bench/fractal_workers.json]

run_fractal trains every (seed, condition) head; under the authors' protocol each head is their 2.1M-parameter network
on batches of 16 rows, whose matrix products are too small to keep more than one core busy. `workers=W` trains W heads
at once, each in its own spawned process with torch.get_num_threads() // W threads. This times run_fractal on CLINC150's
cached vectors (V5 and MRL, --seeds seeds, the first --max-train training rows) with workers=1 (torch's own thread
count) and with workers=W, alternating within each round so that the machine's drift hits both alike; figures are
medians over rounds. It also checks that both give the same steerability per run. Run it alone on the machine.
Without a data directory the generated builtin_intents corpus stands in (a smoke test). The last line is one JSON object;
--out also writes it with what made it (the command, library version, commit).
"""
import argparse
import json
import shlex
import statistics
import sys
import time

import torch

from matryoshka_lab.core import DATA_ENV, provenance, resolve_data_dir
from matryoshka_lab.fractal_runner import PROTOCOLS, fractal_data, run_fractal
from matryoshka_lab.runs import write_json

FULL_HEADS, FULL_TRAIN = 10, 8_500      # the comparison: CLINC, 5 seeds x (V5, MRL), 8,500 training rows each


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help=f"data directory (default: ${DATA_ENV})")
    p.add_argument("--protocol", default="authors", choices=list(PROTOCOLS))
    p.add_argument("--max-train", type=int, default=2000, help="training rows before validation (default 2000)")
    p.add_argument("--max-test", type=int, default=1000)
    p.add_argument("--seeds", type=int, default=2, help="seeds; heads = 2 x seeds (V5, MRL)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/fractal_workers.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    for name in ("max_train", "max_test", "seeds", "epochs", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.workers < 2:
        p.error(f"--workers must be at least 2 to compare with one process, got {args.workers}")
    name = "clinc150" if resolve_data_dir(args.data_dir) is not None else "builtin_intents"
    if name != "clinc150":
        print(f"No data directory (--data-dir or ${DATA_ENV}): the generated builtin_intents corpus stands in; a smoke test.")
    data = fractal_data("embedded", name, args.data_dir, progress=False)
    kw = dict(dataset=data, seeds=args.seeds, conditions=("v5", "mrl"), protocol=args.protocol, epochs=args.epochs,
              max_train=args.max_train, max_test=args.max_test, progress=False)
    heads = 2 * args.seeds
    print(f"{name}: {heads} heads ({args.protocol}, {args.epochs} epochs, <= {args.max_train} training rows); "
          f"torch threads {torch.get_num_threads()}; workers 1 vs {args.workers}; {args.rounds} rounds", flush=True)
    times, S = {1: [], args.workers: []}, {}
    for r in range(args.rounds):
        for w in ((1, args.workers) if r % 2 == 0 else (args.workers, 1)):
            t0 = time.perf_counter()
            res = run_fractal(workers=w, **kw)
            times[w].append(time.perf_counter() - t0)
            S[w] = [x["S_by_eval"] for x in res["runs"]]
        print(f"  round {r + 1}: " + "  ".join(f"workers {w} {t[-1]:.1f}s" for w, t in times.items()), flush=True)
    same = S[1] == S[args.workers]
    med = {w: statistics.median(t) for w, t in times.items()}
    speedup = med[1] / med[args.workers]
    print(f"\nmedian: workers 1 {med[1]:.1f}s, workers {args.workers} {med[args.workers]:.1f}s -> {speedup:.2f}x; "
          f"same S in every run: {same}")
    scale = FULL_TRAIN / res["split"]["n_train"] * 5 / args.epochs   # head time is linear in the training rows and epochs
    full = {w: m / heads * FULL_HEADS * scale / 60 for w, m in med.items()}
    print(f"EXTRAPOLATION (not measured): linear in the {res['split']['n_train']:,} training rows x {args.epochs} epochs to {FULL_TRAIN:,} x 5, the 5-seed CLINC "
          f"V5-vs-MRL comparison ({FULL_HEADS} heads) takes about {full[args.workers]:.0f} min with {args.workers} workers, "
          f"{full[1]:.0f} min in one process")
    result = {"speedup": round(speedup, 3), "median_seconds": {str(w): round(v, 2) for w, v in med.items()},
              "seconds": {str(w): [round(v, 2) for v in t] for w, t in times.items()}, "heads": heads,
              "workers": args.workers, "threads": torch.get_num_threads(), "same_S": same, "source": name,
              "protocol": args.protocol, "n_train": res["split"]["n_train"], "max_train": args.max_train,
              "epochs": args.epochs, "rounds": args.rounds}
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
