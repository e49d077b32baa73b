"""Cost of the layer x dim evaluation grid, measured side by side in one run.

    python bench/eval_grid.py [--data-dir DIR] [--model embedded] [--device cpu] [--repeats 2] [--naive-pairs 300]
                              [--out FILE.json]

Three ways to get the same STS numbers:
  forward  a plain forward pass: last hidden state only, mean pooled (what any encoder user runs once);
  grid     matryoshka_lab.eval.evaluate: one pass with every hidden state, then all (layer, dim) cells by slicing;
  naive    re-encode per (layer, dim) cell, as per-dimension evaluators elsewhere do (one pass per cell).
forward and grid run on every distinct sentence of the STS tasks (STS-B, SICK-R, STS12-16), alternating in chunks of
--chunk sentences (the machine's speed drifts), averaged over --repeats passes; grid time = its encoding plus the
scoring of all cells. naive is timed on the first --naive-pairs STS-B pairs against the grid on the same pairs, since 42
passes over all sentences would take most of an hour. All three run on --device (default: CUDA when present) in the
precision Encoder.encode resolves there (float32 on the CPU), the weights upcast to float32 after loading. The last
line is one JSON object; --out also writes it with what made it (results/bench/eval_grid.json is RESULTS.md's).
"""
import argparse
import json
import shlex
import sys
import time

import torch

from matryoshka_lab.core import autocast, provenance, resolve_precision
from matryoshka_lab.data import STSData, Task, load_task, task_spec
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate, prefix_normalize, score_task, spearman_columns, task_texts
from matryoshka_lab.runs import write_json

STS = ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"]
DIMS = [16, 32, 64, 128, 256, 384]


def forward_precision(enc):
    "The autocast context Encoder.encode runs its forward in on enc's device (none for float32)."
    return autocast(resolve_precision(enc.precision, enc.device), enc.device)


def sync(device):
    if device.type == "cuda":                # CUDA kernels run asynchronously: wait before reading a clock
        torch.cuda.synchronize(device)


@torch.no_grad()
def plain_forward(enc, texts, batch_size):
    "Last layer only, mean pooled, no hidden states kept: the baseline cost of embedding the sentences once."
    out = torch.empty(len(texts), enc.hidden_size, device=enc.device)   # on the device: one copy to the host, at the end
    with forward_precision(enc):
        for idx, batch in enc.batches(texts, batch_size):   # the same tokenisation and batching as Encoder.encode
            h = enc.model(**batch).last_hidden_state.float()
            m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
            out[idx] = (h * m).sum(1) / m.sum(1).clamp_min(1)
    return out.cpu()


@torch.no_grad()
def naive_grid(enc, data, layers, dims, batch_size):
    "One full pass per (layer, dim) cell, keeping only that cell's embedding."
    scores = {}
    for layer in layers:
        for d in dims:
            vecs = []
            for part in (data.sentence1, data.sentence2):
                e = torch.empty(len(part), d, device=enc.device)
                with forward_precision(enc):
                    for idx, batch in enc.batches(part, batch_size):
                        h = enc.model(**batch, output_hidden_states=True).hidden_states[layer].float()
                        m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
                        e[idx] = prefix_normalize((h * m).sum(1) / m.sum(1).clamp_min(1), d)
                vecs.append(e.cpu())
            cos = (vecs[0] * vecs[1]).sum(1, keepdim=True).double().numpy()
            scores[layer, d] = 100 * spearman_columns(cos, data.score)[0]
    return scores


def timed(fn, device):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--chunk", type=int, default=2000, help="sentences per alternation")
    p.add_argument("--naive-pairs", type=int, default=300)
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/eval_grid.py " + shlex.join(sys.argv[1:]))    # the code that runs: its commit now

    enc = Encoder.from_pretrained(args.model, device=args.device)
    enc.model.float()                         # a folder saved in fp16 (bench/device_payload.py): float32 weights
    dev = enc.device
    layers = list(range(enc.num_layers + 1))
    dims = [d for d in DIMS if d <= enc.hidden_size]
    tasks = [load_task(t, args.data_dir) for t in STS]
    texts = list(dict.fromkeys(s for t in tasks for s in t.test.sentence1 + t.test.sentence2))
    print(f"{len(texts)} distinct STS sentences; grid {len(layers)} layers x {len(dims)} dims x {len(tasks)} tasks; "
          f"torch threads {torch.get_num_threads()}")

    # The machine's speed drifts by 20-30% over minutes, so forward and grid encoding alternate chunk by chunk
    # (which goes first alternates too) and each side's time is the sum over chunks: a slow minute hits both.
    t_fwd = t_enc = 0.0
    emb = []
    for r in range(args.repeats):
        chunks = [texts[s:s + args.chunk] for s in range(0, len(texts), args.chunk)]
        parts = []
        for c, chunk in enumerate(chunks):
            for which in (("fwd", "grid") if (c + r) % 2 == 0 else ("grid", "fwd")):
                if which == "fwd":
                    t_fwd += timed(lambda: plain_forward(enc, chunk, args.batch_size), dev)[0]
                else:
                    t, e = timed(lambda: enc.encode(chunk, batch_size=args.batch_size, layers="all", progress=False),
                                 dev)
                    t_enc += t
                    parts.append(e)
        emb = torch.cat(parts, dim=1)
        print(f"  pass {r + 1}: forward {t_fwd / (r + 1):.1f}s  grid encode {t_enc / (r + 1):.1f}s (mean so far)")
    fwd, enc_time = t_fwd / args.repeats, t_enc / args.repeats
    pos = {s: i for i, s in enumerate(texts)}
    t_score = 0.0
    for t in tasks:
        idx = [pos[s] for s in task_texts(t)]
        t_score += timed(lambda: score_task(t, emb[:, idx], dims), dev)[0]
    grid = enc_time + t_score
    t_eval, _ = timed(lambda: evaluate(enc, tasks, layers="all", dims=dims, batch_size=args.batch_size, progress=False),
                      dev)
    print(f"  grid = encode {enc_time:.1f}s + score {t_score:.1f}s; one evaluate() call end to end: {t_eval:.1f}s")

    stsb = tasks[0].test
    n = min(args.naive_pairs, len(stsb))
    sub = STSData(stsb.sentence1[:n], stsb.sentence2[:n], stsb.score[:n])
    t_sub_grid, sub_df = timed(lambda: evaluate(enc, [Task(task_spec("stsb"), sub)], layers="all", dims=dims,
                                                 batch_size=args.batch_size, progress=False), dev)
    t_naive, naive = timed(lambda: naive_grid(enc, sub, layers, dims, args.batch_size), dev)
    worst = max(abs(sub_df[(sub_df.layer == l) & (sub_df.dim == d)].value.item() - v) for (l, d), v in naive.items())

    result = {
        "grid_over_forward": round(grid / fwd, 3),
        "naive_over_grid": round(t_naive / t_sub_grid, 1),
        "forward_seconds": round(fwd, 2),
        "grid_seconds": round(grid, 2),
        "score_seconds": round(t_score, 2),
        "evaluate_call_seconds": round(t_eval, 2),
        "forward_sentences_per_s": round(len(texts) / fwd, 1),
        "n_sentences": len(texts),
        "cells": len(layers) * len(dims) * len(tasks),
        "naive_pairs": n,
        "naive_seconds": round(t_naive, 2),
        "grid_seconds_on_naive_pairs": round(t_sub_grid, 2),
        "naive_vs_grid_max_abs_diff": round(worst, 6),
    }
    print(f"grid / plain forward: {result['grid_over_forward']}x  (target <= 1.05)")
    print(f"naive per-cell re-encoding / grid, on {n} STS-B pairs: {result['naive_over_grid']}x "
          f"(same numbers: max |diff| {worst:.2e})")
    print(f"plain forward throughput: {result['forward_sentences_per_s']} sentences/s")
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
