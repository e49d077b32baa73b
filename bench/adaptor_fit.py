"""How long the post-hoc references take to fit on cached vectors (issue 68's goal: an adaptor in under a minute on
10,000 cached vectors on 2 CPU cores), each fit alone, from the same cached embeddings.

    python bench/adaptor_fit.py [--data-dir DIR] [--model embedded] [--n 10000] [--rounds 1] [--out FILE.json]

The fit set is the first --n distinct texts of STS-B's train split (the STS-B test texts left out), encoded once at
the last hidden state before any timing. Timed: adaptor.fit_adaptor (the unsupervised adaptor, its defaults: at
most 2,000 steps, early stopping), fit_adaptor with STS-B's train pairs (both stages), sparse_codes.fit_csr (2,000
steps) and, for scale, transforms.PCA.fit. Printed per fit: the median seconds over --rounds, the steps it ran and
its ratio to the goal's 60 s (an absolute goal on this machine, so run it alone). The last line is one JSON object;
--out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import sys
import time

import torch

from matryoshka_lab.adaptor import fit_adaptor, fit_pairs
from matryoshka_lab.core import parse_dims, provenance
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import task_texts
from matryoshka_lab.runs import write_json
from matryoshka_lab.sparse_codes import fit_csr
from matryoshka_lab.transforms import PCA, fit_texts

GOAL_S = 60.0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    enc = Encoder.from_pretrained(a.model)
    sts = load_task("stsb", a.data_dir)
    scored = set(task_texts(sts))
    texts = [t for t in fit_texts(sts)[0] if t not in scored][:a.n]
    queries, docs = map(list, zip(*[(q, d) for q, d in zip(*fit_pairs(sts)) if q not in scored and d not in scored]))
    index = list(dict.fromkeys(texts + queries + docs))
    emb = enc.encode(index, layers=[enc.num_layers], progress=False)[0]
    at = {t: i for i, t in enumerate(index)}
    rows = lambda ts: emb[[at[t] for t in ts]]
    x, pairs, dims = rows(texts), (rows(queries), rows(docs)), parse_dims(None, enc.hidden_size)
    fits = {"adaptor": lambda: fit_adaptor(x, dims)[1],
            "adaptor_sup": lambda: fit_adaptor(x, dims, pairs=pairs)[1],
            "csr": lambda: fit_csr(x)[1],
            "pca": lambda: PCA.fit(x[None], [enc.num_layers]).fitted_on}
    seconds, what = {k: [] for k in fits}, {}
    for r in range(a.rounds):
        for name, fit in fits.items():
            torch.manual_seed(0)
            t0 = time.perf_counter()
            what[name] = fit()
            seconds[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: {name:11s} {seconds[name][-1]:.1f} s", file=sys.stderr)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    for k, v in median.items():
        steps = "" if k == "pca" else f"   ({json.dumps(what[k])})"
        print(f"{k:11s} median {v:6.1f} s   {v / GOAL_S:.2f} of the {GOAL_S:.0f} s goal{steps}")
    result = {"model": a.model, "n_fit": len(x), "n_pairs": len(queries), "dims": dims, "rounds": a.rounds,
              "threads": torch.get_num_threads(), "median_s": {k: round(v, 2) for k, v in median.items()},
              "of_goal": {k: round(v / GOAL_S, 3) for k, v in median.items()},
              "fits": {k: v for k, v in what.items() if k != "pca"}}
    print(json.dumps(result))
    if a.out:
        write_json(a.out, {**result, **provenance("python bench/adaptor_fit.py " + shlex.join(sys.argv[1:]))})


if __name__ == "__main__":
    main()
