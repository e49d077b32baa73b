"""Cost of a training-free reference's grid beside the plain grid, measured side by side in one run.

    python bench/transform_grid.py [--data-dir DIR] [--model embedded] [--tasks stsb] [--rounds 3] [--out FILE.json]

  plain   matryoshka_lab.eval.evaluate on --tasks: one forward pass with every hidden state, every (layer, dim) cell;
  pca     the same with transform= PCA at every layer, fitted once before any timing on STS-B's train split less
          the texts the grid scores (transforms.fit_transform);
  random  the same with a seeded random rotation.
Each round runs the three in a rotated order (drift on a noisy machine hits each alike); printed: the median seconds
of each and the ratio of each transform's median to plain's (goal, issue 68: at most 1.05x), and each grid's scores
at the last layer (the same every round). The last line is one JSON object; --out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import sys
import time

from matryoshka_lab.core import provenance
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate, task_texts
from matryoshka_lab.runs import write_json
from matryoshka_lab.transforms import RandomRotation, fit_texts, fit_transform

GOAL = 1.05


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--tasks", default="stsb")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    enc = Encoder.from_pretrained(a.model)
    tasks = [load_task(t, a.data_dir) for t in a.tasks.split(",")]
    scored = [s for t in tasks for s in task_texts(t)]
    texts, source = fit_texts("stsb", a.data_dir)
    transforms = {"plain": None, "pca": fit_transform("pca", enc, texts, "all", source, exclude=scored),
                  "random": RandomRotation(enc.hidden_size, 0)}
    seconds, last = {k: [] for k in transforms}, {}
    names = list(transforms)
    for r in range(a.rounds):
        for name in names[r % 3:] + names[:r % 3]:
            t0 = time.perf_counter()
            grid = evaluate(enc, tasks, progress=False, transform=transforms[name])
            seconds[name].append(time.perf_counter() - t0)
            top = grid[grid.layer == grid.layer.max()]
            last[name] = {f"{t}/{m}": dict(zip(g.dim.tolist(), g.value.round(2).tolist())) for (t, m), g in top.groupby(["task", "metric"])}
            print(f"round {r + 1}: {name:6s} {seconds[name][-1]:.2f} s", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = {k: round(median[k] / median["plain"], 3) for k in ("pca", "random")}
    for k in names:
        print(f"{k:6s} median {median[k]:6.2f} s" + ("" if k == "plain" else f"   {ratio[k]:.3f}x plain (goal <= {GOAL}x)"))
        print(f"       last layer: {last[k]}")
    result = {"tasks": a.tasks, "model": a.model, "n_texts": len(set(scored)), "n_fit": transforms["pca"].fitted_on["n_fit"],
              "rounds": a.rounds, "median_s": {k: round(v, 3) for k, v in median.items()}, "ratio_to_plain": ratio,
              "goal": GOAL, "last_layer": last, "seconds": seconds}
    if a.out:
        write_json(a.out, {**provenance(shlex.join(["python", *sys.argv])), **result})
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}))


if __name__ == "__main__":
    main()
