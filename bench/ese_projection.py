"""ESE's compression target: the library's route against the exact SVD it replaces, side by side in one run.

    python bench/ese_projection.py [--model embedded] [--data-dir DIR] [--device cuda] [--texts 512] [--k 128] [--rounds 20]
                                   [--out FILE]

ESE (07_losses) pulls the first k dims of every layer towards x @ U_k S_k, the top-k singular pairs of
A = softmax(x^T x / sqrt(D)), on the 2B texts of a batch. The inputs are the model's pooled vectors of --texts STS-B
sentences at the layers ESE compresses (the last and hidden states 0..L-2). Routes, each timed for all those layers:
  svd64        torch.linalg.svd of each A in float64, one layer at a time (the definition)
  eigh64       the library's ese_projection with side_by_side=False: eigh of A A^T in float64, every layer in one
              batched call
  eigh64_side_by_side  the library's route: the same with each layer's eigh on a host thread and (on CUDA) a stream
              of its own (the same routine per matrix, so the same numbers: max_diff_side_by_side)
  eigh64_host  the same eigendecomposition on the host's CPU cores (A A^T copied over and U S back)
  eigh64_threads  the same on the host, each layer's matrix in a thread of its own (one torch thread each: the layers
              side by side on as many cores)
  eigh32       the same in float32 (for the record: S^2 spans below float32's resolution)
  svd32        torch.linalg.svd in float32, one layer at a time
  eigh64_magma eigh64 (one batched call) with MAGMA as torch's linear-algebra library (CUDA only; cuSOLVER is its
              default)
  lowrank      the ESE authors' torch.svd_lowrank(A, q=k) in float32, every layer at once: a randomised range
              finder with 2 power iterations (seeded here), so not the exact U_k S_k: its error is the point
Each route's error is ||P - P_svd64|| / ||P_svd64|| over all layers, and its worst column's. Every round times each
route once (the order rotating); medians. The last line is one JSON object; --out also writes it with what made it
(results/bench/ese_projection.json: an H100's, before the lowrank route; ese_projection_cpu.json: 2 CPU cores').
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from matryoshka_lab.core import provenance, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.losses import ese_projection
from matryoshka_lab.runs import write_json
from timing import clock                          # bench/ is the script's folder


def svd_route(x, k, dtype):
    "The definition, one matrix at a time: SVD of A, each singular vector's largest entry made positive."
    out = []
    for xi in x:
        A = torch.softmax(xi.T @ xi / math.sqrt(xi.shape[-1]), dim=-1).to(dtype)
        U, S, _ = torch.linalg.svd(A)
        U = U[:, :k] * torch.sign(U[:, :k].gather(0, U[:, :k].abs().argmax(0, keepdim=True)))
        out.append(xi.to(dtype) @ (U * S[:k]))
    return torch.stack(out)


def host_route(x, k):
    "ese_projection's route with the float64 eigendecomposition on the CPU."
    A = torch.softmax(x.mT @ x / math.sqrt(x.shape[-1]), dim=-1).double()
    lam, U = torch.linalg.eigh((A @ A.mT).cpu())
    U, S = U[..., -k:].flip(-1).to(x.device), lam[..., -k:].flip(-1).clamp_min(0).sqrt().to(x.device)
    U = U * torch.sign(U.gather(-2, U.abs().argmax(-2, keepdim=True)))
    return (x.double() @ (U * S[..., None, :])).to(x.dtype)


def threads_route(x, k, pool):
    "host_route with each layer's eigendecomposition in its own thread of `pool` (torch's intra-op threads set to 1)."
    A = torch.softmax(x.mT @ x / math.sqrt(x.shape[-1]), dim=-1).double()
    M = (A @ A.mT).cpu()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lam, U = map(torch.stack, zip(*pool.map(torch.linalg.eigh, M)))
    finally:
        torch.set_num_threads(threads)
    U, S = U[..., -k:].flip(-1).to(x.device), lam[..., -k:].flip(-1).clamp_min(0).sqrt().to(x.device)
    U = U * torch.sign(U.gather(-2, U.abs().argmax(-2, keepdim=True)))
    return (x.double() @ (U * S[..., None, :])).to(x.dtype)


def eigh32_route(x, k):
    "ese_projection's route in float32."
    A = torch.softmax(x.mT @ x / math.sqrt(x.shape[-1]), dim=-1)
    lam, U = torch.linalg.eigh(A @ A.mT)
    U, S = U[..., -k:].flip(-1), lam[..., -k:].flip(-1).clamp_min(0).sqrt()
    U = U * torch.sign(U.gather(-2, U.abs().argmax(-2, keepdim=True)))
    return x @ (U * S[..., None, :])


def magma_route(x, k):
    "ese_projection with MAGMA as torch's linear-algebra library for the call (restored after)."
    before = torch.backends.cuda.preferred_linalg_library()
    torch.backends.cuda.preferred_linalg_library("magma")
    try:
        return ese_projection(x, k, side_by_side=False)
    finally:
        torch.backends.cuda.preferred_linalg_library(before)


def lowrank_route(x, k, seed=0):
    "The authors' randomised top-k SVD of A (torch.svd_lowrank, float32), the same sign convention as ours."
    A = torch.softmax(x.mT @ x / math.sqrt(x.shape[-1]), dim=-1)
    torch.manual_seed(seed)                           # svd_lowrank draws from the global generator
    U, S, _ = torch.svd_lowrank(A, q=k)
    U = U * torch.sign(U.gather(-2, U.abs().argmax(-2, keepdim=True)))
    return x @ (U * S[..., None, :])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--texts", type=int, default=512, help="rows of x: the 2B texts of a batch")
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/ese_projection.py " + shlex.join(sys.argv[1:]))
    device = resolve_device(args.device)
    task = load_task("stsb", args.data_dir)
    texts = list(dict.fromkeys(task.test.sentence1 + task.test.sentence2))[: args.texts]
    enc = Encoder.from_pretrained(args.model, device=device)
    enc.model.float()                                 # a folder saved in fp16 (bench/device_payload.py): fp32 vectors
    E = enc.encode(texts, progress=False, precision="fp32")           # [L+1, N, D] on the CPU
    N = enc.num_layers
    x = E[[N, *range(N - 1)]].to(device)              # the layers ESE compresses
    pool = ThreadPoolExecutor(min(len(x), os.cpu_count() or 1))
    routes = {"svd64": lambda: svd_route(x, args.k, torch.float64),
              "eigh64": lambda: ese_projection(x, args.k, side_by_side=False),
              "eigh64_side_by_side": lambda: ese_projection(x, args.k, side_by_side=True),
              "eigh64_host": lambda: host_route(x, args.k), "eigh64_threads": lambda: threads_route(x, args.k, pool),
              "eigh32": lambda: eigh32_route(x, args.k), "svd32": lambda: svd_route(x, args.k, torch.float32),
              "lowrank": lambda: lowrank_route(x, args.k)}
    if device.type == "cuda":
        routes["eigh64_magma"] = lambda: magma_route(x, args.k)
    ref = routes["svd64"]().double()
    same = float((routes["eigh64_side_by_side"]() - routes["eigh64"]()).abs().max())
    err = {}
    for name, fn in routes.items():
        got = fn().double()
        cols = (got - ref).norm(dim=-2) / ref.norm(dim=-2)
        err[name] = {"rel": float((got - ref).norm() / ref.norm()), "worst_column": float(cols.max())}
    times = {n: [] for n in routes}
    names = list(routes)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = clock(device)
            routes[name]()
            times[name].append(clock(device) - t0)
    med = {n: statistics.median(v) * 1000 for n, v in times.items()}
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {x.shape[0]} layers of "
          f"[{x.shape[1]}, {x.shape[2]}], k {args.k}")
    for n in names:
        print(f"{n:20s} {med[n]:8.2f} ms   rel error {err[n]['rel']:.1e}   worst column {err[n]['worst_column']:.1e}")
    result = {"device": str(device), "layers": x.shape[0], "rows": x.shape[1], "D": x.shape[2], "k": args.k,
              "ms": {n: round(v, 3) for n, v in med.items()}, "error": err,
              "svd64_over_eigh64": round(med["svd64"] / med["eigh64"], 2),
              "eigh64_over_side_by_side": round(med["eigh64"] / med["eigh64_side_by_side"], 2),
              "max_diff_side_by_side": same}
    print(json.dumps(result))
    if args.out:
        machine = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        write_json(args.out, {**made, "machine": machine, "result": result})


if __name__ == "__main__":
    main()
