"""The operations one training step dispatches, by method and phase: what a GPU's host has to issue, counted anywhere.

    python bench/step_ops.py [--model embedded] [--data-dir DIR] [--device cpu] [--batch-size 8] [--max-length 32]
                             [--methods base mrl 2dmse ese mipic mic] [--out FILE]

On a GPU our step is bound by the host issuing kernels (results/bench/gpu_profile.txt: two MRL steps took 87 ms of CPU
time and 27 ms of GPU time), so how many operations a step dispatches stands for its host time, and unlike a time it
is the same on every run. Each method's Trainer (SimCSE, dims 16..384, the STS-B test sentences) takes one step, then
its second step is counted by a TorchDispatchMode: every aten operation dispatched, the backward's included, by
phase: `views` (method_views: the model's forward and pooling), `loss` (the method's loss), `backward`, and `rest`
(clipping, the optimizer, the step's bookkeeping), each split into view operations (no kernel: view, detach,
select, ...) and the others (a kernel each, or a few). Counts do not depend on the batch's size, only on the code,
the device's code paths and the torch version: on the CPU MRL's prefixes run as a loop and AdamW is not fused (on a
GPU MRL runs its batched form and AdamW one fused kernel a parameter group), so read the CPU's `loss` and `rest`
with that in mind. The last line is one JSON object; --out also writes it with what made it
(results/bench/step_ops.json: the CPU's).
"""
import argparse
import collections
import json
import shlex
import sys
import tempfile

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from matryoshka_lab import trainer as trainer_module
from matryoshka_lab.config import make_config
from matryoshka_lab.core import provenance, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.methods import Callback, TrainData
from matryoshka_lab.runs import write_json
from matryoshka_lab.trainer import Trainer

PHASES = ("views", "loss", "backward", "rest")


class Counter(TorchDispatchMode):
    "Counts every aten operation dispatched inside it, by the phase set at the time and by whether it is a view."
    def __init__(self):
        super().__init__()
        self.phase, self.counts = "rest", collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.phase, "view" if func.is_view else "other"] += 1
        return func(*args, **(kwargs or {}))

    def within(self, phase: str, fn):
        "fn, counted under `phase` while it runs."
        def counted(*args, **kwargs):
            outer, self.phase = self.phase, phase
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = outer
        return counted


def count_step(trainer: Trainer) -> dict:
    "The operations of the trainer's next step, {phase: {'other': n, 'view': n}}."
    counter = Counter()
    views, loss_fn, backward = trainer_module.method_views, trainer.loss_fn, torch.Tensor.backward
    trainer_module.method_views = counter.within("views", views)
    trainer.loss_fn = counter.within("loss", loss_fn)
    torch.Tensor.backward = counter.within("backward", backward)
    try:
        with counter:
            trainer.step += 1
            trainer.train_step()
    finally:
        trainer_module.method_views, trainer.loss_fn, torch.Tensor.backward = views, loss_fn, backward
    return {p: {k: counter.counts[p, k] for k in ("other", "view")} for p in PHASES}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--methods", nargs="+", default=["base", "mrl", "2dmse", "ese", "mipic", "mic"])
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/step_ops.py " + shlex.join(sys.argv[1:]))
    device = resolve_device(args.device)
    encoder = Encoder.from_pretrained(args.model, device=device)
    encoder.model.float()                             # a folder saved in fp16 (bench/device_payload.py): fp32 weights
    texts = list(dict.fromkeys(load_task("stsb", args.data_dir).test.sentence1))[: 4 * args.batch_size]
    counts = {}
    with tempfile.TemporaryDirectory() as run_dir:
        for method in args.methods:
            cfg = make_config({"model": args.model, "method": method, "objective": "simcse", "batch_size": args.batch_size,
                               "max_length": args.max_length, "device": str(device), "max_steps": 10, "eval_every": -1,
                               "diagnostics_every": -1, "run_dir": run_dir, "dims": [16, 32, 64, 128, 256, 384]})
            trainer = Trainer(cfg, encoder=encoder, data=TrainData(texts), progress=False, drop=(Callback,))
            encoder.train()
            trainer.step = 1
            trainer.train_step()                      # first step: lazy state (AdamW's moments, cached constants)
            counts[method] = count_step(trainer)
            trainer.batches.close()
    print(f"{'method':8s}" + "".join(f"{ph:>18s}" for ph in PHASES) + f"{'step':>18s}   (operations: kernels + views)")
    for method, c in counts.items():
        cells = [f"{c[ph]['other']:>9d} + {c[ph]['view']:<6d}" for ph in PHASES]
        total = {k: sum(c[ph][k] for ph in PHASES) for k in ("other", "view")}
        print(f"{method:8s}" + "".join(cells) + f"{total['other']:>9d} + {total['view']:<6d}")
    result = {"device": str(device), "torch": torch.__version__, "batch_size": args.batch_size,
              "max_length": args.max_length, "counts": counts}
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
