"""Encoding throughput against the machine's limit, measured side by side in one run.

    python bench/encode.py [--data-dir DIR] [--model embedded] [--device cpu] [--n 3000] [--batch-size 64] [--rounds 3]
                           [--other-batch-sizes 16 256] [--out results/bench/encode.json]

On the same texts (the first N distinct STS-B test and dev sentences) and batch size, interleaved round by round
(the machine's speed drifts), median of --rounds:
  ours_fp32   Encoder.encode, last hidden state, mean pooled, float32
  ours_bf16   the same with precision bf16 (the forward pass under torch.autocast with bfloat16)
  st_fp32     sentence-transformers' SentenceTransformer.encode of the same model folder, float32
Alternatives timed in the same rounds: the other attention implementation (fp32 runs PyTorch's SDPA, bf16 on the
CPU eager attention: encoder.BF16_CPU_ATTENTION), and other batch sizes.
The roofline: the transformer's FLOPs for the texts, per layer and token 8 D^2 (the four attention projections)
+ 4 D I (the feed-forward, width I) + 4 T D (scores and weighted sum over T tokens), divided by the time, against
the FLOP rate of matmuls of the same precision: a large square one (the cores' peak) and one of the model's own shape
(a batch's tokens x D times D x I). Both are trials interleaved with the passes (trial, pass, trial, ..., trial: one in
the pass's precision before each ours_fp32 and ours_bf16 pass, one of each after the last round), each the best of a few
calls; the peak is the best
trial, and the spread (min / median / max) of the trials and of the pass's own rate is reported: a single matmul
measured once after the passes gave fractions of 0.61 to 1.44 on the same machine. "Useful" FLOPs count each text's
own tokens; "executed" FLOPs count the padded batches our encoder runs. Where the rest of the time goes: tokenisation,
and a torch.profiler breakdown of one pass by operator. Scores: STS-B test Spearman at every hidden state x prefix dim in
both precisions (the largest difference). Everything runs on --device (default: CUDA when present; there the profile
shares out GPU time and the clocks wait for the GPU), the weights upcast to float32 after loading. The last line is one JSON
object; --out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import sys
import time

import torch

from matryoshka_lab.core import cpu_has_native_bf16, provenance, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab import encoder as encoder_module
from matryoshka_lab.encoder import Encoder, resolve_model
from matryoshka_lab.eval import evaluate
from matryoshka_lab.runs import write_json
from timing import clock                          # bench/ is the script's folder

DIMS = "16,32,64,128,256,384"


def flops(enc: Encoder, lengths: list[int], batch_size: int) -> tuple[float, float]:
    "(useful, executed) FLOPs of the transformer layers for texts of these token lengths, batched longest first."
    cfg = enc.model.config
    D, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    per_token = 8 * D * D + 4 * D * I
    useful = L * sum(n * per_token + 4 * n * n * D for n in lengths)
    ordered = sorted(lengths, reverse=True)
    executed = 0
    for s in range(0, len(ordered), batch_size):
        B, T = len(ordered[s:s + batch_size]), ordered[s]
        executed += L * B * (T * per_token + 4 * T * T * D)
    return float(useful), float(executed)


def matmul_trial(m: int, k: int, n: int, dtype, device, repeats: int = 3):
    "A trial: () -> the best FLOP/s of [m, k] @ [k, n] in dtype over `repeats` timed calls (operands made and warmed once)."
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    calls = 1 if device.type == "cpu" else 20     # a GPU matmul takes microseconds: time a run of calls
    a @ b
    def trial():
        best = float("inf")
        for _ in range(repeats):
            t0 = clock(device)
            for _ in range(calls):
                a @ b
            best = min(best, clock(device) - t0)
        return 2.0 * m * k * n * calls / best
    return trial


def spread(values) -> dict:
    "min / median / max of GFLOP/s values given in FLOP/s."
    return {k: round(f(values) / 1e9, 1) for k, f in (("min", min), ("median", statistics.median), ("max", max))}


def with_bf16_attention(implementation, run):
    "run() with encoder.BF16_CPU_ATTENTION set to `implementation` (None: bf16 keeps the model's SDPA)."
    before, encoder_module.BF16_CPU_ATTENTION = encoder_module.BF16_CPU_ATTENTION, implementation
    try:
        return run()
    finally:
        encoder_module.BF16_CPU_ATTENTION = before


def profile_ops(enc: Encoder, texts: list[str], batch_size: int, precision: str, top: int = 6) -> list[tuple[str, float]]:
    "Share of time by operator over one encode pass of `texts` (the `top` largest): CPU time, on CUDA the GPU's."
    from torch.profiler import ProfilerActivity, profile
    cuda = enc.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        enc.encode(texts, batch_size=batch_size, layers="-1", progress=False, precision=precision)
    events = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    total = sum(own(e) for e in events)
    rows = sorted(((e.key, own(e) / total) for e in events), key=lambda r: -r[1])
    return [(k, round(v, 3)) for k, v in rows[:top]]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded", help="embedded, or a model folder (bench/device_payload.py's model/)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--n", type=int, default=3000, help="texts (distinct STS-B test and dev sentences)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--other-batch-sizes", type=int, nargs="*", default=[16, 256], help="also timed, as alternatives")
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/encode.py " + shlex.join(sys.argv[1:]))    # the code that runs: its commit now

    test, dev = load_task("stsb", args.data_dir), load_task("stsb_dev", args.data_dir)
    pool = [s for t in (test, dev) for s in t.test.sentence1 + t.test.sentence2]
    texts = list(dict.fromkeys(pool))[:args.n]
    device = resolve_device(args.device)
    load = lambda **kw: Encoder.from_pretrained(args.model, device=device, **kw).float()   # fp16 folders: fp32 weights
    enc = load()
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(resolve_model(args.model), device=str(device)).float()
    st.max_seq_length = enc.max_length
    lengths = [len(ids) for ids in enc.tokenizer(texts, truncation=True, max_length=enc.max_length)["input_ids"]]
    useful, executed = flops(enc, lengths, args.batch_size)
    print(f"{len(texts)} texts, {sum(lengths)} tokens (mean {sum(lengths) / len(texts):.1f}); batch {args.batch_size}; "
          f"torch threads {torch.get_num_threads()}; native bf16: {cpu_has_native_bf16()}; device {device}")

    ours = lambda e, prec, bs: (lambda: e.encode(texts, batch_size=bs, layers="-1", progress=False, precision=prec))
    runs = {"ours_fp32": ours(enc, "fp32", args.batch_size), "ours_bf16": ours(enc, "bf16", args.batch_size),
            "st_fp32": lambda: st.encode(texts, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False)}
    # the alternatives: the other attention implementation (fp32 runs SDPA; bf16 on the CPU eager, BF16_CPU_ATTENTION),
    # and other batch sizes
    runs["ours_fp32_eager_attention"] = ours(load(attn_implementation="eager"), "fp32", args.batch_size)
    runs["ours_bf16_sdpa_attention"] = lambda: with_bf16_attention(None, ours(enc, "bf16", args.batch_size))
    for prec in ("fp32", "bf16"):
        for bs in args.other_batch_sizes:
            runs[f"ours_{prec}_batch{bs}"] = ours(enc, prec, bs)
    D, I = enc.hidden_size, enc.model.config.intermediate_size
    tokens_per_batch = args.batch_size * round(sum(lengths) / len(lengths))
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    # the matmul trials, one before each of the roofline's passes (ours_fp32, ours_bf16) and one after the last
    trials = {prec: {"peak": matmul_trial(2048, 2048, 2048, dtype, device),
                     "shaped": matmul_trial(tokens_per_batch, D, I, dtype, device)} for prec, dtype in dtypes.items()}
    rates = {prec: {kind: [] for kind in ("peak", "shaped")} for prec in dtypes}
    def trial(prec):
        for kind, fn in trials[prec].items():
            rates[prec][kind].append(fn())

    times = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):             # interleaved, the order rotating: a slow minute hits every setup
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name in ("ours_fp32", "ours_bf16"):
                trial(name.split("_")[1])
            t0 = clock(device)
            runs[name]()
            times[name].append(clock(device) - t0)
        print(f"  round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.1f}s" for n in names[:3]))
    for prec in dtypes:
        trial(prec)
    med = {n: statistics.median(v) for n, v in times.items()}

    t0 = time.perf_counter()
    enc.tokenizer(texts, truncation=True, max_length=enc.max_length, padding=False)
    tokenize_s = time.perf_counter() - t0

    peak = {prec: max(r["peak"]) for prec, r in rates.items()}
    shaped = {prec: max(r["shaped"]) for prec, r in rates.items()}
    rate = {prec: useful / med[f"ours_{prec}"] for prec in dtypes}

    ops = {prec: profile_ops(enc, texts[:512], args.batch_size, prec) for prec in ("fp32", "bf16")}

    scores = {prec: evaluate(load(precision=prec), ["stsb"], data_dir=args.data_dir, layers="all", dims=DIMS,
                             progress=False).set_index(["layer", "dim"]).value for prec in ("fp32", "bf16")}
    diff = (scores["bf16"] - scores["fp32"]).abs()
    worst = diff.idxmax()

    result = {
        "bf16_over_fp32_throughput": round(med["ours_fp32"] / med["ours_bf16"], 3),
        "ours_over_st_throughput": round(med["st_fp32"] / med["ours_fp32"], 3),
        "ours_bf16_over_st_throughput": round(med["st_fp32"] / med["ours_bf16"], 3),
        "fraction_of_matmul_peak_fp32": round(rate["fp32"] / peak["fp32"], 3),
        "fraction_of_matmul_peak_bf16": round(rate["bf16"] / peak["bf16"], 3),
        "fraction_of_shaped_matmul_fp32": round(rate["fp32"] / shaped["fp32"], 3),
        "fraction_of_shaped_matmul_bf16": round(rate["bf16"] / shaped["bf16"], 3),
        "max_score_diff_bf16_vs_fp32": round(float(diff.max()), 3),
        "max_score_diff_cell": f"stsb L{worst[0]} d{worst[1]}",
        "texts_per_s": {n: round(len(texts) / v, 1) for n, v in med.items()},
        "alternatives_over_default": {n: round(med[n.split("_")[0] + "_" + n.split("_")[1]] / v, 3)
                                      for n, v in med.items() if n.count("_") > 1},
        "median_seconds": {n: round(v, 3) for n, v in med.items()},
        "gflops_useful_per_s": {prec: round(v / 1e9, 1) for prec, v in rate.items()},
        "gflops_matmul_peak": {prec: round(v / 1e9, 1) for prec, v in peak.items()},
        "gflops_matmul_model_shape": {prec: round(v / 1e9, 1) for prec, v in shaped.items()},
        "model_shape_matmul": [tokens_per_batch, D, I],
        "matmul_trials": len(rates["fp32"]["peak"]),
        "gflops_matmul_peak_spread": {prec: spread(r["peak"]) for prec, r in rates.items()},
        "gflops_matmul_model_shape_spread": {prec: spread(r["shaped"]) for prec, r in rates.items()},
        "gflops_useful_per_s_spread": {prec: spread([useful / t for t in times[f"ours_{prec}"]]) for prec in dtypes},
        "device": str(device),
        "padding_overhead": round(executed / useful - 1, 4),
        "tokenize_share_fp32": round(tokenize_s / med["ours_fp32"], 3),
        "top_ops": ops,
        "n_texts": len(texts), "tokens": sum(lengths), "batch_size": args.batch_size, "rounds": args.rounds,
        "threads": torch.get_num_threads(), "native_bf16": cpu_has_native_bf16(),
    }
    print(f"bf16 / fp32 throughput {result['bf16_over_fp32_throughput']}x (goal >= 1.4); ours / sentence-transformers "
          f"{result['ours_over_st_throughput']}x (goal >= 1.5)")
    for prec in dtypes:
        print(f"{prec}: {rate[prec] / 1e9:.1f} useful GFLOP/s = {result[f'fraction_of_matmul_peak_{prec}']:.0%} of a 2048^3 "
              f"matmul ({peak[prec] / 1e9:.1f}), {result[f'fraction_of_shaped_matmul_{prec}']:.0%} of a {tokens_per_batch}x{D}x{I} one "
              f"({shaped[prec] / 1e9:.1f}); largest ops " + ", ".join(f"{k} {v:.0%}" for k, v in ops[prec][:4]))
        print("  spread (GFLOP/s, min / median / max): the pass "
              + " / ".join(map(str, result["gflops_useful_per_s_spread"][prec].values()))
              + f"; {result['matmul_trials']} interleaved trials: 2048^3 "
              + " / ".join(map(str, result["gflops_matmul_peak_spread"][prec].values()))
              + ", model shape " + " / ".join(map(str, result["gflops_matmul_model_shape_spread"][prec].values())))
    print(f"padding adds {result['padding_overhead']:.1%} FLOPs; tokenisation is {result['tokenize_share_fp32']:.1%} of the fp32 pass; "
          f"largest STS-B score difference bf16 vs fp32 {result['max_score_diff_bf16_vs_fp32']} ({result['max_score_diff_cell']})")
    print("alternatives, throughput / the default's: " + ", ".join(f"{k} {v}x" for k, v in result["alternatives_over_default"].items()))
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
