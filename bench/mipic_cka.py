"""MIPIC's top-k CKA terms (Eq. 7-12): the library's centred Grams against HSIC's expansion, side by side in one run.

    python bench/mipic_cka.py [--model embedded] [--data-dir DIR] [--device cuda] [--task stsb] [--texts 256]
                              [--max-length 128] [--rounds 5] [--out FILE]

The inputs are what MIPIC's SIA sees in a training step (15_mipic): the model's token states of the first --texts test
texts of --task (STS-B's short sentences, padded to the batch's longest; 20newsgroups' posts fill --max-length) at
its SIA layers (the default MIPIC of the model, the MRL dims 16..384, the model's own mean pooling as the anchor),
float32, and the nested top-k selections of their attention scores. Routes, each timed forward and backward (the
gradient of the CKA terms' sum with respect to the token states, the full-width teacher detached):
  centred     the library's prefix_cka: every Gram centred over each dim's selection, H_w K H_w, then
              <K_c, L_c> / (|K_c| |L_c|)
  expansion   no centred Gram formed: <H_w K H_w, H_w L H_w> = <H_w K H_w, L> expanded into
              w^T (K o L) w - (2 / n) sum_i w_i (K w)_i (L w)_i + (w^T K w)(w^T L w) / n^2 (written out here)
Each route's error is its largest absolute CKA difference from the centred route in float64, and the relative
difference of its gradient. Every round times each route once (the order alternating); medians; the ratio
centred / expansion is measured in this run. The last line is one JSON object; --out also writes it with what made
it (results/bench/mipic_cka_*.json: 2 CPU cores').
"""
import argparse
import json
import shlex
import statistics
import sys

import torch

from matryoshka_lab.core import provenance, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.losses import info_nce
from matryoshka_lab.mipic import MIPIC, prefix_grams, prefix_cka, teacher_attention, topk_tokens
from matryoshka_lab.runs import write_json
from timing import clock                          # bench/ is the script's folder


def expansion_cka(h, select, dims, eps=1e-12):
    "prefix_cka's value without centred Grams: HSIC's expansion on the same shifted prefix Grams and detached teacher."
    w = select.to(h.dtype)
    union = w.amax(0)
    h = h - (torch.einsum("...bt,...btd->...bd", union, h) / union.sum(-1, keepdim=True).clamp_min(1.0)).detach()[..., None, :]
    grams = prefix_grams(h, (*dims, h.shape[-1]))
    kx, ky = grams[:-1], grams[-1].detach()                       # [K, L, B, T, T] and the teacher [L, B, T, T]
    n, wt = w.sum(-1).clamp_min(1.0), w.movedim(0, -1)            # wt [L, B, T, K]: ky against every selection at once
    quad = lambda m: ((m @ w[..., None]).squeeze(-1) * w).sum(-1)          # w^T m w
    sx, sy = (kx @ w[..., None]).squeeze(-1), (ky @ wt).movedim(-1, 0)      # K w, L w
    def hsic(q, a, b):
        return q - 2 / n * (w * a * b).sum(-1) + (w * a).sum(-1) * (w * b).sum(-1) / n ** 2
    num, xx = hsic(quad(kx * ky), sx, sy), hsic(quad(kx * kx), sx, sx)
    yy = hsic((((ky * ky) @ wt).movedim(-1, 0) * w).sum(-1), sy, sy)
    return num / (xx.clamp_min(eps).sqrt() * yy.clamp_min(eps).sqrt())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--task", default="stsb", help="a pair task (both sides' sentences) or a text task")
    p.add_argument("--texts", type=int, default=256, help="texts: the rows of one view of a batch")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    made = provenance("python bench/mipic_cka.py " + shlex.join(sys.argv[1:]))
    device = resolve_device(args.device)
    test = load_task(args.task, args.data_dir).test
    texts = list(dict.fromkeys(test.sentence1 + test.sentence2 if hasattr(test, "sentence1") else test.text))[: args.texts]
    enc = Encoder.from_pretrained(args.model, device=device)
    enc.model.float()                                 # a folder saved in fp16 (bench/device_payload.py): fp32 states
    loss = MIPIC(info_nce, dims=(16, 32, 64, 128, 256, 384), hidden_size=enc.hidden_size, num_layers=enc.num_layers,
                 anchor="cls" if enc.pooling == "cls" else "pooled")
    with torch.no_grad():
        out = enc(**enc.tokenize(texts, args.max_length, device=device), tokens=True)
    mask = out.attention_mask
    h0 = out.hidden[[out.layers.index(layer) for layer in loss.layers]].float()        # [L, B, T, D]
    scores, _ = teacher_attention(h0, mask, loss.att_tau, anchor=loss.anchor)
    select = topk_tokens(scores, mask, loss.gammas, loss.k_min, loss.anchor)            # [K, L, B, T]
    dims = loss.sia_dims
    routes = {"centred": lambda h: prefix_cka(h, select, dims), "expansion": lambda h: expansion_cka(h, select, dims)}

    def run(name, h):
        h = h.detach().requires_grad_()
        value = routes[name](h)
        value.sum().backward()
        return value.detach(), h.grad

    ref, ref_grad = run("centred", h0.double())
    err = {}
    for name in routes:
        value, grad = run(name, h0)
        err[name] = {"cka_max_abs": float((value.double() - ref).abs().max()),
                     "grad_rel": float((grad.double() - ref_grad).norm() / ref_grad.norm())}
    times = {n: [] for n in routes}
    names = list(routes)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[: r % 2]:
            t0 = clock(device)
            run(name, h0)
            times[name].append(clock(device) - t0)
    med = {n: statistics.median(v) * 1000 for n, v in times.items()}
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{machine}, {args.task}: {len(loss.layers)} layers x {len(texts)} texts x {h0.shape[2]} tokens x {h0.shape[3]} dims, "
          f"prefixes {dims}, selections of {select.sum(-1).float().mean():.1f} tokens on average")
    for n in names:
        print(f"{n:10s} {med[n]:9.1f} ms forward + backward   CKA error {err[n]['cka_max_abs']:.1e}   "
              f"gradient error {err[n]['grad_rel']:.1e}")
    result = {"device": str(device), "task": args.task, "layers": len(loss.layers), "rows": len(texts), "tokens": h0.shape[2],
              "D": h0.shape[3], "dims": list(dims), "ms": {n: round(v, 2) for n, v in med.items()}, "error": err,
              "centred_over_expansion": round(med["centred"] / med["expansion"], 3)}
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "machine": machine, "result": result})


if __name__ == "__main__":
    main()
