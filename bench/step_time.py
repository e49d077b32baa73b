"""Training-step time of the Matryoshka losses, measured side by side in one run.

    python bench/step_time.py [--model embedded] [--device cpu] [--batch-size 32] [--max-length 32] [--rounds 12] [--out FILE]

One step = encode both sides of a batch of (anchor, positive) pairs, the loss, backward, an AdamW step, on one fixed
batch shape. Every round times one step of each setup in turn (the order rotates), so the machine's drift hits all
alike; each setup's figure is its median over rounds. Everything runs on --device (default: CUDA when present), in
float32 (weights upcast after loading); on CUDA each clock read waits for the GPU. Setups:
  base        ours, InfoNCE on the full embedding (no Matryoshka)
  mrl         ours, MRL over dims 16..384 (InfoNCE on every prefix of the one embedding)
  2dmse       ours, 2DMSE (last + one sampled layer, full + one sampled prefix, KL alignment)
  st_mrl      sentence-transformers MatryoshkaLoss(MultipleNegativesRankingLoss) over the same dims
  st_2d       sentence-transformers Matryoshka2dLoss(MultipleNegativesRankingLoss), one layer and one dim per step
  mipic       ours, MIPIC (MRL + SIA + PIC on the token states of the same pass; its P_i and phi_i are trained too)
  mic         ours, MIC (MRL + SCR + SIR on the token states of the same pass)
  st_ours_*   sentence-transformers' step with our loss through the adapter (matryoshka_lab.st_loss.MatryoshkaLabLoss):
              what SentenceTransformerTrainer.compute_loss runs, loss(features, labels), then backward and AdamW, for
              mrl, 2dmse, mipic and mic
The last line is one JSON object with the ratios (mrl_over_base, 2dmse_over_mrl, mrl_over_st_matryoshka,
2dmse_over_st_matryoshka2d, mipic_over_mrl, mic_over_mrl, and st_ours_M_over_M for the adapter) and the medians in seconds; --out also writes it, with the
command, commit and date, to FILE (the committed one is results/bench/step_time.json, read by RESULTS.md's table).
"""
import argparse
import json
import statistics
import warnings

import torch

from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder, resolve_model
from matryoshka_lab.core import resolve_device
from matryoshka_lab.losses import MRL, TwoDMSE, info_nce
from matryoshka_lab.mic import MIC
from matryoshka_lab.mipic import MIPIC
from matryoshka_lab.studies.report import STEP_TIME_GOALS
from matryoshka_lab.st_loss import MatryoshkaLabLoss
from timing import clock, method_step, st_step, write_record   # bench/ is the script's folder

DIMS = [16, 32, 64, 128, 256, 384]
ADAPTED = ("mrl", "2dmse", "mipic", "mic")   # our losses timed inside sentence-transformers' step too


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", default=None, help="also write the result as JSON to this file (results/bench/step_time.json)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import losses as st_losses
    from sentence_transformers.util import batch_to_device
    device = resolve_device(args.device)

    try:
        pairs = load_task("stsb", args.data_dir).train
        text_a, text_b = pairs.sentence1[: args.batch_size], pairs.sentence2[: args.batch_size]
    except ValueError:
        pairs = load_task("builtin_sts").train
        text_a, text_b = pairs.sentence1[: args.batch_size], pairs.sentence2[: args.batch_size]

    torch.manual_seed(0)
    enc = Encoder.from_pretrained(args.model, max_length=args.max_length, device=device).train()
    enc.model.float()                                   # a folder saved in fp16 (bench/device_payload.py): train in fp32
    dims = [d for d in DIMS if d <= enc.hidden_size]
    ba, bb = enc.tokenize(text_a, args.max_length), enc.tokenize(text_b, args.max_length)
    gen = torch.Generator().manual_seed(0)
    mipic = MIPIC(info_nce, dims, enc.hidden_size, enc.num_layers,
                  anchor="cls" if enc.pooling == "cls" else "pooled").to(device)   # as make_loss
    mic = MIC(info_nce, dims, enc.hidden_size, enc.num_layers).to(device)
    opt = torch.optim.AdamW(list(enc.parameters()) + list(mipic.parameters()), lr=0.0)   # lr 0: same work, same weights
    setups = {"base": method_step(enc, "base", MRL(info_nce, dims=(enc.hidden_size,)), ba, bb, opt, gen),
              "mrl": method_step(enc, "mrl", MRL(info_nce, dims=dims), ba, bb, opt, gen),
              "2dmse": method_step(enc, "2dmse", TwoDMSE(info_nce, dims=[d for d in dims if d < enc.hidden_size]), ba, bb, opt, gen),
              "mipic": method_step(enc, "mipic", mipic, ba, bb, opt, gen),
              "mic": method_step(enc, "mic", mic, ba, bb, opt, gen)}
    st = SentenceTransformer(resolve_model(args.model), device=str(device)).float()
    st.max_seq_length = args.max_length
    st.train()
    feats = [batch_to_device(st.preprocess(text_a), device), batch_to_device(st.preprocess(text_b), device)]
    adapters = {m: MatryoshkaLabLoss(st, m, dims=dims).to(device) for m in ADAPTED}
    st_opt = torch.optim.AdamW(list(st.parameters()) + [p for a in adapters.values() if a.loss is not None
                                                         for p in a.loss.parameters()], lr=0.0)
    mnrl = st_losses.MultipleNegativesRankingLoss(st)
    setups["st_mrl"] = st_step(st_losses.MatryoshkaLoss(st, mnrl, matryoshka_dims=dims[::-1]), feats, st_opt)
    setups["st_2d"] = st_step(st_losses.Matryoshka2dLoss(st, mnrl, matryoshka_dims=dims[::-1]), feats, st_opt)
    for m, adapter in adapters.items():
        setups[f"st_ours_{m}"] = st_step(adapter, feats, st_opt)

    names = list(setups)
    for name in names:          # warm-up: allocator, threads, first-call overheads
        setups[name]()
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = clock(device)
            setups[name]()
            times[name].append(clock(device) - t0)
    med = {n: statistics.median(v) for n, v in times.items()}
    for n in names:
        print(f"{n:14s} median {med[n] * 1000:7.1f} ms/step  (min {min(times[n]) * 1000:.1f}, max {max(times[n]) * 1000:.1f})")
    result = {"mrl_over_base": round(med["mrl"] / med["base"], 3),
              "2dmse_over_mrl": round(med["2dmse"] / med["mrl"], 3),
              "mrl_over_st_matryoshka": round(med["mrl"] / med["st_mrl"], 3),
              "2dmse_over_st_matryoshka2d": round(med["2dmse"] / med["st_2d"], 3),
              "mipic_over_mrl": round(med["mipic"] / med["mrl"], 3),
              "mic_over_mrl": round(med["mic"] / med["mrl"], 3),
              **{f"st_ours_{m}_over_{m}": round(med[f"st_ours_{m}"] / med[m], 3) for m in ADAPTED},
              "batch_size": args.batch_size, "max_length": args.max_length, "rounds": args.rounds,
              "median_seconds": {n: round(v, 4) for n, v in med.items()}}
    print("; ".join(f"{label} {result[key]}x (goal <= {goal})" for key, (label, goal) in STEP_TIME_GOALS.items()))
    print(json.dumps(result))
    if args.out:
        write_record(args.out, device, result)


if __name__ == "__main__":
    main()
