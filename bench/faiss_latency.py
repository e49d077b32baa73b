"""FAISS query latency per prefix length (fractal_embeddings.txt Table 9), measured side by side in one run.

    python bench/faiss_latency.py [--vectors FILE.npy] [--n-flat 10000] [--n-hnsw 100000] [--n-queries 1000] [--rounds 5]
                                  [--out results/bench/faiss_latency.json]

For every prefix length d in --dims, a Flat inner-product index of --n-flat rows and an HNSW index of --n-hnsw rows
over the unit d-prefixes of the vectors (matryoshka_lab.routing.faiss_latency). Every round times each (index, d)
once, in rotating order, so the machine's drift hits all alike; each figure is the median over rounds, per query,
both one query per search call and one batched call. Without --vectors the vectors are random Gaussian (256 dims):
Flat search cost depends only on n and d, HNSW's also on the data through the graph walk. Rows are resampled with
noise when the file has fewer than the index needs. The paper's sizes take minutes (HNSW construction); use e.g.
--n-hnsw 5000 for a quick check. The last line is one JSON object with the ratios latency(full) / latency(d); --out
also writes every (index, dim) row with what made it (RESULTS.md's and nbs/20_routing.ipynb's Table 9 read that file).
"""
import argparse
import json
import os
import shlex
import sys

import numpy as np

from matryoshka_lab.core import provenance
from matryoshka_lab.routing import faiss_latency, latency_table
from matryoshka_lab.runs import write_json


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", default=None, help="a float [N, D] .npy file (default: Gaussian, D = the largest dim)")
    p.add_argument("--dims", default="64,128,192,256")
    p.add_argument("--n-flat", type=int, default=10_000)
    p.add_argument("--n-hnsw", type=int, default=100_000)
    p.add_argument("--n-queries", type=int, default=1_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--hnsw-m", type=int, default=32)
    p.add_argument("--ef-construction", type=int, default=40)
    p.add_argument("--ef-search", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="FAISS OpenMP threads during the measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the rows with their provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/faiss_latency.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    dims = [int(d) for d in args.dims.split(",")]
    if args.vectors:
        vectors = np.load(args.vectors).astype(np.float32)
    else:
        vectors = np.random.default_rng(args.seed).standard_normal((max(args.n_flat, args.n_hnsw), dims[-1])).astype(np.float32)

    df = faiss_latency(vectors, dims, n_flat=args.n_flat, n_hnsw=args.n_hnsw, n_queries=args.n_queries, k=args.k,
                       hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, ef_search=args.ef_search,
                       rounds=args.rounds, threads=args.threads, seed=args.seed)
    print(f"faiss {df.attrs['faiss']}, {args.threads} thread(s), {args.n_queries} queries, k = {args.k}, {args.rounds} rounds, "
          f"HNSW M = {args.hnsw_m}, efConstruction = {args.ef_construction}, efSearch = {args.ef_search}")
    print(latency_table(df).to_string())
    ratios = {}
    for _, r in df.iterrows():
        ratios[f"{r['index']}_{dims[-1]}_over_{r['dim']}"] = round(float(r["speedup_vs_full"]), 3)
        ratios[f"{r['index']}_batch_{dims[-1]}_over_{r['dim']}"] = round(float(r["batch_speedup_vs_full"]), 3)
    for kind in ("flat", "hnsw"):
        g = df[df["index"] == kind]
        print(f"{kind:4s} latency({dims[-1]}) / latency(d): "
              + ", ".join(f"d={d}: {s:.2f}x (batched {b:.2f}x)" for d, s, b in zip(g.dim, g.speedup_vs_full, g.batch_speedup_vs_full))
              + f"; HNSW recall@1 vs exact {g.recall_at_1.round(3).tolist()}" * (kind == "hnsw"))
    result = {"ratios": ratios, "n_flat": args.n_flat, "n_hnsw": args.n_hnsw, "n_queries": args.n_queries, "rounds": args.rounds,
              "threads": args.threads, "ef_search": args.ef_search, "hnsw_m": args.hnsw_m,
              "latency_us": {f"{r['index']}_{r['dim']}": round(float(r["latency_us"]), 2) for _, r in df.iterrows()},
              "batch_latency_us": {f"{r['index']}_{r['dim']}": round(float(r["batch_latency_us"]), 2) for _, r in df.iterrows()},
              "recall_at_1": {f"hnsw_{r['dim']}": round(float(r["recall_at_1"]), 4) for _, r in df[df["index"] == "hnsw"].iterrows()}}
    print(json.dumps(result))
    if args.out:
        record = {**made, "machine": f"{os.cpu_count()} CPU cores", "vectors": args.vectors or "Gaussian",
                  "settings": {**df.attrs, "n_flat": args.n_flat, "n_hnsw": args.n_hnsw, "seed": args.seed},
                  "rows": json.loads(df.round(4).to_json(orient="records"))}
        write_json(args.out, record)


if __name__ == "__main__":
    main()
