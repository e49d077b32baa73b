"""The losses' two forms, a loop and a batched computation, side by side in one run: operations issued and time.

    python bench/loss_forms.py [--device cuda] [--batch-size 256] [--rounds 20] [--out FILE]

Off the CPU four losses compute their terms at once instead of one after another (07_losses, 15_mipic): MRL's
prefixes (`info_nce_prefixes` under InfoNCE; under AnglE's three terms, `angle_objective_prefixes`: every prefix laid
out in its halves, zero-padded), 2DMSE's two layers per width (`TwoDMSE.stacked_terms`), ESE's layers
(`ESE.stacked_terms`), each under InfoNCE and under AnglE, and MIPIC's PIC steps (`info_nce_stacked` on the steps
zero-padded to the widest); AnglE's gold scores here are random, 0-5. On a GPU a step is bound by the host issuing
kernels, so the batched forms are there to issue fewer; on the CPU they can cost more flops than the launches they
save, and the CPU keeps the loops.
Each pair is run here on the same seeded inputs of the embedded model's shape (hidden states 0..6 of a [B, 384]
pooled embedding, the MRL dims 16..384, 2DMSE's four objective terms with hidden state 3 and prefix 64 drawn, ESE's
k = 128 with its targets computed once for both forms, MIPIC's default PIC chain): `ops` counts the aten operations
each form dispatches, views apart, forward and backward (a TorchDispatchMode: the same on every run); `ms` is the
median of --rounds timed forward + backward passes, the forms alternating; `loop_over_batched` is the ratio of those
medians, measured in this run; `max_abs_diff` compares the forms' values. The last line is one JSON object; --out also
writes it with what made it.
"""
import argparse
import collections
import json
import shlex
import statistics
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from matryoshka_lab.core import provenance, resolve_device
from matryoshka_lab.losses import (ESE, TwoDMSE, angle_objective, angle_objective_prefixes, ese_projection, info_nce,
                                   info_nce_prefixes, info_nce_stacked)
from matryoshka_lab.mipic import MIPIC, anchor_states
from matryoshka_lab.runs import write_json
from timing import clock                          # bench/ is the script's folder

DIMS, LAYERS, D = (16, 32, 64, 128, 256, 384), 6, 384


class Counter(TorchDispatchMode):
    "Counts the aten operations dispatched inside it that are not views."
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def forms(device, batch_size, gen):
    "{loss: (inputs, loop, batched)}: each form a function of the inputs -> a vector of terms."
    a, b = (torch.randn(LAYERS + 1, batch_size, D, generator=gen).to(device) for _ in range(2))
    ese, ese_angle = ESE(info_nce), ESE(angle_objective)
    score = torch.randint(0, 6, (batch_size,), generator=gen).float().to(device)      # AnglE's gold scores, 0..5
    layers = [LAYERS, *range(LAYERS - 1)]
    targets = ese_projection(torch.cat([a, b], 1)[layers], ese.compression_size)
    mipic = MIPIC(info_nce, DIMS, hidden_size=D, num_layers=LAYERS).to(device)
    tokens = torch.randn(LAYERS + 1, batch_size, 16, D, generator=gen).to(device)
    states = anchor_states(tokens, torch.ones(batch_size, 16, dtype=torch.long, device=device))
    chain = lambda s: [s[layer, :, :d] for layer, d in mipic.pic_checkpoints]
    pic = lambda s: ([phi(z) for phi, z in zip(mipic.projectors, chain(s))], chain(s)[1:])
    ese_terms = lambda out: torch.stack([out.total, *out.parts.values()])     # the parts are detached: total's backward
    cells = {"last_full": (LAYERS, D), "shallow_full": (3, D), "last_prefix": (LAYERS, 64), "shallow_prefix": (3, 64)}
    two_d = lambda terms: torch.stack(list(terms.values()))
    return {
        "mrl": ((a[-1], b[-1]),
                lambda x, y: torch.stack([info_nce(x[:, :d], y[:, :d]) for d in DIMS]),
                lambda x, y: info_nce_prefixes(x, y, DIMS)),
        "mrl_angle": ((a[-1], b[-1]),
                      lambda x, y: torch.stack([angle_objective(x[:, :d], y[:, :d], score) for d in DIMS]),
                      lambda x, y: angle_objective_prefixes(x, y, DIMS, score)),
        "2dmse": ((a, b),
                  lambda x, y: two_d(TwoDMSE(info_nce).looped_terms(x, y, None, cells)),
                  lambda x, y: two_d(TwoDMSE(info_nce).stacked_terms(x, y, None, cells))),
        "2dmse_angle": ((a, b),
                        lambda x, y: two_d(TwoDMSE(angle_objective).looped_terms(x, y, score, cells)),
                        lambda x, y: two_d(TwoDMSE(angle_objective).stacked_terms(x, y, score, cells))),
        "ese": ((a, b),
                lambda x, y: ese_terms(ese.looped_terms(x, y, None, layers, targets)),
                lambda x, y: ese_terms(ese.stacked_terms(x, y, None, layers, targets))),
        "ese_angle": ((a, b),
                      lambda x, y: ese_terms(ese_angle.looped_terms(x, y, score, layers, targets)),
                      lambda x, y: ese_terms(ese_angle.stacked_terms(x, y, score, layers, targets))),
        "pic": ((states,),
                lambda s: torch.stack([info_nce(p, t, scale=1.0 / mipic.tau) for p, t in zip(*pic(s))]),
                lambda s: info_nce_stacked(*pic(s), scale=1.0 / mipic.tau)),
    }


def run(fn, inputs):
    "fn's terms and their sum's backward to the inputs (and any parameters): the terms, detached."
    leaves = [x.detach().requires_grad_() for x in inputs]
    terms = fn(*leaves)
    terms.sum().backward()
    return terms.detach()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/loss_forms.py " + shlex.join(sys.argv[1:]))
    device = resolve_device(args.device)
    result = {"device": str(device), "torch": torch.__version__, "batch_size": args.batch_size}
    for name, (inputs, loop, batched) in forms(device, args.batch_size, torch.Generator().manual_seed(0)).items():
        row, times = {}, collections.defaultdict(list)
        for form, fn in (("loop", loop), ("batched", batched)):
            run(fn, inputs)                                  # warm-up: lazy state, cached constants
            leaves = [x.detach().requires_grad_() for x in inputs]
            with Counter() as forward:
                terms = fn(*leaves)
            with Counter() as backward:
                terms.sum().backward()
            row[form] = {"ops": {"forward": forward.count, "backward": backward.count}}
        order = (("loop", loop), ("batched", batched))
        for i in range(args.rounds):
            for form, fn in order if i % 2 == 0 else order[::-1]:
                start = clock(device)
                run(fn, inputs)
                times[form].append(clock(device) - start)
        for form in ("loop", "batched"):
            row[form]["ms"] = round(statistics.median(times[form]) * 1e3, 3)
        row["loop_over_batched"] = round(row["loop"]["ms"] / row["batched"]["ms"], 3)
        row["max_abs_diff"] = float((run(loop, inputs) - run(batched, inputs)).abs().max())
        result[name] = row
        ops = {form: sum(row[form]["ops"].values()) for form in ("loop", "batched")}
        print(f"{name:11s} ops loop {ops['loop']:5d} batched {ops['batched']:5d} | ms loop {row['loop']['ms']:8.3f} "
              f"batched {row['batched']['ms']:8.3f} ({row['loop_over_batched']}x) | max diff {row['max_abs_diff']:.2e}")
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
