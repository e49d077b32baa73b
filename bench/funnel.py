"""Funnel search against exact search on a 59k-document corpus, quality and per-query latency side by side in one run.

    python bench/funnel.py [--data-dir DIR] [--model embedded] [--task mrpc_paraphrase_59k] [--n-timed 200]
                           [--rounds 3] [--threads 1] [--out results/bench/funnel.json]

The task's queries and corpus (mrpc_paraphrase_59k: MRPC test's 1,147 paraphrase queries among 59,134 texts) are
encoded once by the model's last hidden state (mean pooled, cached on disk: matryoshka_lab.encoder.encode_cached).
matryoshka_lab.deploy.funnel_curve then builds exact float32 full-width search (FAISS IndexFlatIP), full-width HNSW
and a FunnelIndex per shortlist setting (float32 prefixes 32/64/128 and binary prefixes 128/256/384, each in a flat
and an HNSW index, shortlists k' 10..1000, reranked at full width), scores every one on all queries (nDCG@10 by
eval.retrieval_metrics) and times --n-timed queries one per call, every setting once per round in rotating order, on
--threads FAISS threads. The goal of issue 34: >= 10x lower median query latency than exact full-width float32 search
at >= 0.99 of its nDCG@10 (deploy.best_funnel). Also measured, for the budget advisor (deploy.advise): one search of
a single-stage index per (dim, precision) of the evaluation grid (deploy.search_latency) and one query's encoding
through each number of layers (deploy.encode_latency), on --threads torch threads. The last line is one JSON
object; --out also writes the whole curve, the latency tables and what made them.
"""
import argparse
import json
import os
import shlex
import sys

from matryoshka_lab.core import provenance, resolve_data_dir
from matryoshka_lab.data import load_task
from matryoshka_lab.deploy import best_funnel, encode_latency, funnel_curve, search_latency
from matryoshka_lab.encoder import Encoder, encode_cached
from matryoshka_lab.runs import write_json

GOAL_SPEEDUP, GOAL_RATIO = 10.0, 0.99


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--task", default="mrpc_paraphrase_59k")
    p.add_argument("--prefixes", default="32,64,128", help="float32 shortlist prefixes")
    p.add_argument("--binary-prefixes", default="128,256,384", help="binary shortlist prefixes (multiples of 8)")
    p.add_argument("--shortlists", default="10,20,50,100,200,500,1000")
    p.add_argument("--grid-dims", default="16,32,64,128,256,384", help="dims of the single-stage latency table")
    p.add_argument("--n-timed", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    made = provenance("python bench/funnel.py " + shlex.join(sys.argv[1:]))
    ints = lambda s: [int(x) for x in s.split(",") if x]
    data_dir = resolve_data_dir(args.data_dir)
    if data_dir is None:
        p.error("the shared data is needed: --data-dir DIR or $MATRYOSHKA_LAB_DATA")
    task = load_task(args.task, data_dir).test
    enc = Encoder.from_pretrained(args.model)
    last = enc.num_layers
    emb = encode_cached(args.model, list(task.queries) + list(task.corpus), layers=[last], batch_size=args.batch_size,
                        encoder=enc)[0].numpy()
    queries, corpus = emb[:len(task.queries)], emb[len(task.queries):]
    print(f"{args.task}: {len(queries)} queries, {len(corpus)} documents, {corpus.shape[1]} dims; "
          f"{os.cpu_count()} CPU cores, {args.threads} search thread(s)", flush=True)

    curve = funnel_curve(queries, corpus, task.qrels, prefixes=ints(args.prefixes), binary_prefixes=ints(args.binary_prefixes),
                         shortlists=ints(args.shortlists), n_timed=args.n_timed, rounds=args.rounds, threads=args.threads)
    cols = ["stage", "precision", "index", "prefix", "shortlist", "ndcg_at_10", "ndcg_ratio", "median_us", "p90_us",
            "speedup_vs_exact", "bytes_per_vector"]
    print(curve[cols].round(3).to_string(index=False), flush=True)
    search = search_latency(corpus, queries, ints(args.grid_dims), n_timed=args.n_timed, rounds=args.rounds, threads=args.threads)
    encode = encode_latency(enc, list(task.queries), rounds=args.rounds, threads=args.threads)
    print(search.pivot(index="dim", columns="precision", values="search_us").round(1).to_string())
    print(encode.round(1).to_string(index=False))

    best = best_funnel(curve, GOAL_RATIO)
    exact = curve[curve.stage == "exact"].iloc[0]
    result = {"task": args.task, "n_queries": len(queries), "n_corpus": len(corpus), "threads": args.threads,
              "exact_median_us": round(float(exact.median_us), 1), "exact_ndcg_at_10": round(float(exact.ndcg_at_10), 3),
              "goal": {"speedup_vs_exact": GOAL_SPEEDUP, "ndcg_ratio_vs_exact": GOAL_RATIO}}
    if best is None:
        result.update(best=None, goal_met=False)
    else:
        result.update(best={k: (v.item() if hasattr(v, "item") else v) for k, v in best[cols].items()},
                      speedup_vs_exact=round(float(best.speedup_vs_exact), 2), ndcg_ratio_vs_exact=round(float(best.ndcg_ratio), 4),
                      goal_met=bool(best.speedup_vs_exact >= GOAL_SPEEDUP))
    if args.out:
        record = {**made, "machine": f"{os.cpu_count()} CPU cores", "model": args.model, "settings": curve.attrs,
                  "summary": result, "curve": json.loads(curve.round(4).to_json(orient="records")),
                  "latency": {"encode": encode.round(2).to_dict(orient="list"), "search": search.round(2).to_dict(orient="list")}}
        write_json(args.out, record)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
