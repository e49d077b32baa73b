"""Training-step time and peak memory of gradient caching (GradCache) against the one-pass step, batch size by batch size.

    python bench/grad_cache.py [--model embedded] [--device cpu] [--batch-sizes 64,256,1024] [--mini-batch-size 32] [--mini-batch-tokens N] [--max-length 32] [--rounds 3]
        [--setups plain,cached,cached_tokens,st_cached] [--loss-batch-sizes 1024,4096] [--out FILE]

One step = encode both sides of a batch of B (anchor, positive) pairs, MRL over dims 16..384 with InfoNCE (in-batch
negatives), backward, an AdamW step (lr 0: the same work, the same weights), models in train mode (dropout on), in
float32; each setup's loss is the one the trainer makes for it (recipe.make_loss: with mini-batches, InfoNCE row block
by row block). The pairs are STS-B's train pairs (builtin_sts without the data), cycled when B is past their number:
repeated texts change nothing in the work, so this is fine for timing. For each B, every round times one step of each
setup in turn (the order rotates) after one warm-up step each; each time is the median over rounds, each ratio the
median of the round-by-round ratios (a round's steps are seconds apart, so the machine's drift over minutes cancels;
at B = 1,024 a step takes about 20 s and the 2-core machine's speed drifts by 10%). Then a separate
pass runs one step of each setup for its peak memory: on CUDA the allocator's peak over what was allocated before the
step; on the CPU the C heap's peak in use over its use before (glibc's mallinfo2 read after every aten op: torch's CPU
tensors live there), or without glibc the growth of the process's peak RSS. A setup out of memory at a B is recorded
as null. The texts' lengths grow with B too (STS-B's longest texts are rare: a mini-batch of 32 rows reaches 15
tokens at B = 64, 28 at 1,024), and a mini-batch's graph grows with its length; so the cached setups' peaks are
measured again on texts of max_length tokens (consecutive texts joined, cut by the tokenizer): their growth with
B alone; and plain and cached are timed again on them, as above: the caching's own cost, with no padding for the
mini-batches to save (on natural texts a mini-batch pads only to its own longest row, the one-pass step to the
batch's). Last, the loss alone (MRL over the same dims on random [B, 384] views, backward) in one product and row
block by row block, at each of --loss-batch-sizes: what its [B, B] logits take. Setups:
  plain       ours, one pass: method_views (matryoshka_lab.views) on the pre-tokenised sides, the loss, backward
  cached      ours, GradCache: CachedViews encodes each side in mini-batches of --mini-batch-size rows (longest first)
              without a graph, the loss on its leaf views, backward, then cache.backward() re-encodes each mini-batch
              with a graph
  cached_tokens  the same with mini-batches cut by a budget of --mini-batch-tokens padded tokens (default: the
              mini-batch size x max length), rows longest first: short texts go many to a mini-batch
  st_cached   sentence-transformers MatryoshkaLoss(CachedMultipleNegativesRankingLoss(mini_batch_size)) over the same
              dims on the same texts
The last line is one JSON object: batch_sizes, mini_batch_size, mini_batch_tokens, max_length, rounds, memory (what the
peaks measure), seconds {setup: {B: median}}, round_seconds {setup: {B: [each round's]}}, seconds_full_length and
round_seconds_full_length (plain and cached on texts of max_length tokens), peak_mib and peak_mib_full_length
{setup: {B: MiB}}, loss_peak_mib {one_pass, by_rows: {B: MiB}}, cached_over_plain, cached_over_plain_full_length,
cached_over_st_cached and cached_tokens_over_plain {B: time ratio},
cached_over_st_cached_rounds {B: [each round's ratio]},
and cached_memory_growth, cached_memory_growth_full_length and plain_memory_growth (peak at the largest B over peak at
the smallest); --out also writes it, with the command, commit, date and machine, to FILE.
"""
import argparse
import ctypes
import json
import statistics
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from matryoshka_lab.config import TrainConfig
from matryoshka_lab.core import resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder, resolve_model
from matryoshka_lab.methods import get_method
from matryoshka_lab.recipe import make_loss
from matryoshka_lab.views import CachedViews
from timing import clock, method_step, st_step, write_record   # bench/ is the script's folder

DIMS = [16, 32, 64, 128, 256, 384]
SETUPS = ("plain", "cached", "cached_tokens", "st_cached")
CACHED = ("cached", "cached_tokens", "st_cached")


def cached_step(enc, loss, ba, bb, max_length, opt, gen, size=None, tokens=None):
    "One step on GradCache's views: the loss's backward to the leaves, then cache.backward() through the encoder."
    method = get_method("mrl")
    def step():
        opt.zero_grad(set_to_none=True)
        cache = CachedViews(method, enc, ba, bb, max_length, size=size, tokens=tokens)
        loss(*cache.views, None, generator=gen).total.backward()
        cache.backward()
        opt.step()
    return step


def ran(step, device) -> bool:
    "Run `step`; False when the device ran out of memory."
    try:
        step()
        return True
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return False


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use():
    "A function giving the bytes of C heap in use (glibc's mallinfo2: arenas' allocated chunks plus mmapped ones), or None without glibc 2.33+."
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    def in_use() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd
    return in_use


class _HeapPeak(TorchDispatchMode):
    "Within it, the peak of heap in use (read after every aten op, backward's included) over its use on entry."
    def __init__(self, in_use):
        super().__init__()
        self.in_use, self.start, self.peak = in_use, in_use(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use() - self.start)
        return out


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _rss_peak(step) -> float:
    "The growth of the process's peak RSS during step(), in bytes (VmHWM reset through /proc/self/clear_refs, where allowed)."
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status_kb("VmRSS")
    step()
    return (_status_kb("VmHWM") - before) * 1024


def peak_mib(step, device) -> float:
    "Memory one step adds at its peak, in MiB: CUDA's allocated peak over the allocated before it; on the CPU the heap's peak in use over its use before (without glibc: peak RSS growth)."
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    in_use = _heap_in_use()
    if in_use is None:
        return _rss_peak(step) / 2**20
    with _HeapPeak(in_use) as heap:
        step()
    return heap.peak / 2**20


def memory_measure(device) -> str:
    "What peak_mib measures on device, for the record."
    if device.type == "cuda":
        return "CUDA allocator's peak allocated over allocated before the step"
    if _heap_in_use() is None:
        return "growth of the process's peak RSS (VmHWM) during the step"
    return "C heap in use (glibc mallinfo2, read after every aten op): peak over its use before the step"


def full_length_texts(texts: list[str], size: int, max_length: int) -> list[str]:
    "size texts of max_length tokens or more: consecutive texts joined, max_length // 8 + 1 at a time (of STS-B's, 997 in 1,000 reach 32 tokens)."
    k, n = max_length // 8 + 1, len(texts)
    return [" ".join(texts[(i * k + j) % n] for j in range(k)) for i in range(size)]


def loss_step(loss, size: int, width: int, device, gen):
    "The loss alone, forward and backward, on random views [size, width] (pooled vectors, as the trainer passes them)."
    a, b = (torch.randn(size, width, generator=gen).to(device).requires_grad_() for _ in range(2))
    return lambda: loss(a, b, None, generator=gen).total.backward()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--batch-sizes", default="64,256,1024")
    p.add_argument("--mini-batch-size", type=int, default=32)
    p.add_argument("--mini-batch-tokens", type=int, default=None,
                   help="cached_tokens' budget of padded tokens per mini-batch (default: mini-batch size x max length)")
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--loss-batch-sizes", default="1024,4096", help="batch sizes of the loss-alone memory measure ('' for none)")
    p.add_argument("--out", default=None, help="also write the result as JSON to this file")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import losses as st_losses
    from sentence_transformers.util import batch_to_device
    device = resolve_device(args.device)
    sizes = sorted(int(b) for b in args.batch_sizes.split(","))
    loss_sizes = sorted(int(b) for b in args.loss_batch_sizes.split(",") if b)
    names = [s for s in SETUPS if s in args.setups.split(",")]
    mini = args.mini_batch_size
    tokens = args.mini_batch_tokens or mini * args.max_length

    try:
        pairs = load_task("stsb", args.data_dir).train
    except ValueError:
        pairs = load_task("builtin_sts").train
    n = len(pairs.sentence1)

    torch.manual_seed(0)
    enc = Encoder.from_pretrained(args.model, max_length=args.max_length, device=device).train()
    enc.model.float()                                   # a folder saved in fp16 (bench/device_payload.py): train in fp32
    dims = [d for d in DIMS if d <= enc.hidden_size]
    def loss_for(**mini_batches):                       # the trainer's loss for MRL over InfoNCE with these mini-batches
        cfg = TrainConfig(method="mrl", objective="infonce", dims=tuple(dims), max_length=args.max_length, **mini_batches)
        return make_loss(cfg, enc.hidden_size, enc.num_layers)
    loss, by_rows, by_tokens = loss_for(), loss_for(mini_batch_size=mini), loss_for(mini_batch_tokens=tokens)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(enc.parameters(), lr=0.0)
    if "st_cached" in names:
        st = SentenceTransformer(resolve_model(args.model), device=str(device)).float()
        st.max_seq_length = args.max_length
        st.train()
        st_opt = torch.optim.AdamW(st.parameters(), lr=0.0)
        st_loss = st_losses.MatryoshkaLoss(
            st, st_losses.CachedMultipleNegativesRankingLoss(st, mini_batch_size=mini, show_progress_bar=False),
            matryoshka_dims=dims[::-1])

    def steps_on(text_a, text_b, setups):
        ba, bb = enc.tokenize(text_a, args.max_length), enc.tokenize(text_b, args.max_length)
        steps = {"plain": lambda: method_step(enc, "mrl", loss, ba, bb, opt, gen),
                 "cached": lambda: cached_step(enc, by_rows, ba, bb, args.max_length, opt, gen, size=mini),
                 "cached_tokens": lambda: cached_step(enc, by_tokens, ba, bb, args.max_length, opt, gen, tokens=tokens),
                 "st_cached": lambda: st_step(st_loss, [batch_to_device(st.preprocess(t), device) for t in (text_a, text_b)],
                                              st_opt)}
        return {s: steps[s]() for s in setups}

    def measure(step):
        for o in (opt, st_opt) if "st_cached" in names else (opt,):
            o.zero_grad(set_to_none=True)
        try:
            return round(peak_mib(step, device), 1)
        except torch.OutOfMemoryError:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    def timed(steps: dict, seconds: dict, round_seconds: dict, size: int) -> dict:
        "Each step's time over the rounds, setups in turn (the order rotates), after a warm-up each (allocator, threads, first-call overheads): medians into seconds, each round's into round_seconds; {setup: times} of those that ran."
        live = [s for s in steps if ran(steps[s], device)]
        times = {s: [] for s in live}
        for r in range(args.rounds):
            k = r % max(len(live), 1)
            for s in live[k:] + live[:k]:
                t0 = clock(device)
                if s in times and ran(steps[s], device):
                    times[s].append(clock(device) - t0)
                else:
                    times.pop(s, None)
        for s in steps:
            seconds[s][size] = round(statistics.median(times[s]), 4) if s in times else None
            round_seconds[s][size] = [round(t, 4) for t in times[s]] if s in times else None
        return times

    seconds, round_seconds, peaks = ({s: {} for s in names} for _ in range(3))
    full_peaks = {s: {} for s in names if s in CACHED}
    full_timed = [s for s in ("plain", "cached") if s in names]   # the caching's own cost, no padding to save
    full_seconds, full_round_seconds = ({s: {} for s in full_timed} for _ in range(2))
    for size in sizes:
        steps = steps_on([pairs.sentence1[i % n] for i in range(size)], [pairs.sentence2[i % n] for i in range(size)], names)
        times = timed(steps, seconds, round_seconds, size)
        for s in names:
            peaks[s][size] = measure(steps[s]) if s in times else None
        full = steps_on(full_length_texts(pairs.sentence1, size, args.max_length),
                        full_length_texts(pairs.sentence2, size, args.max_length), list(dict.fromkeys(full_timed + list(full_peaks))))
        timed({s: full[s] for s in full_timed}, full_seconds, full_round_seconds, size)
        for s in full_peaks:
            full_peaks[s][size] = measure(full[s])
    loss_peaks = {"one_pass": {}, "by_rows": {}}
    for size in loss_sizes:
        for name, lo in (("one_pass", loss), ("by_rows", by_rows)):
            loss_peaks[name][size] = measure(loss_step(lo, size, enc.hidden_size, device, gen))

    def ratio(x, y):
        return round(x / y, 3) if x is not None and y else None

    def at(table, s, size):
        return table.get(s, {}).get(size)

    print(f"{'B':>6s}  {'setup':14s} {'median ms':>10s} {'peak MiB':>9s} {'full length':>11s}")
    for size in sizes:
        for s in names:
            ms, mib, full_mib = seconds[s][size], peaks[s][size], at(full_peaks, s, size)
            print(f"{size:6d}  {s:14s} {'OOM' if ms is None else f'{ms * 1000:.1f}':>10s} "
                  f"{'-' if mib is None else f'{mib:.1f}':>9s} {'-' if full_mib is None else f'{full_mib:.1f}':>11s}")
    for size in loss_sizes:
        print(f"loss alone at B={size}: one product {loss_peaks['one_pass'][size]} MiB, "
              f"{mini} rows at a time {loss_peaks['by_rows'][size]} MiB")
    def paired(x, y, b, rounds=round_seconds):           # x over y round by round (the machine's drift cancels)
        xs, ys = at(rounds, x, b), at(rounds, y, b)
        return [round(p / q, 3) for p, q in zip(xs, ys)] if xs and ys else None

    def median_ratio(x, y, rounds=round_seconds):
        return {b: round(statistics.median(r), 3) if (r := paired(x, y, b, rounds)) else None for b in sizes}
    over_plain = median_ratio("cached", "plain")
    over_plain_full = median_ratio("cached", "plain", full_round_seconds)
    over_st_rounds = {b: paired("cached", "st_cached", b) for b in sizes}
    over_st = median_ratio("cached", "st_cached")
    tokens_over_plain = median_ratio("cached_tokens", "plain")
    for b in sizes:
        print(f"B={b}: cached/plain {over_plain[b]}x (texts of {args.max_length} tokens {over_plain_full[b]}x), cached/st_cached {over_st[b]}x (rounds {over_st_rounds[b]}), cached_tokens/plain "
              f"{tokens_over_plain[b]}x, peak over B={sizes[0]}: "
              f"cached {ratio(at(peaks, 'cached', b), at(peaks, 'cached', sizes[0]))}x "
              f"(full length {ratio(at(full_peaks, 'cached', b), at(full_peaks, 'cached', sizes[0]))}x), "
              f"plain {ratio(at(peaks, 'plain', b), at(peaks, 'plain', sizes[0]))}x")
    result = {"batch_sizes": sizes, "mini_batch_size": mini, "mini_batch_tokens": tokens, "max_length": args.max_length,
              "rounds": args.rounds, "memory": memory_measure(device),
              "seconds": seconds, "round_seconds": round_seconds, "peak_mib": peaks, "peak_mib_full_length": full_peaks, "loss_peak_mib": loss_peaks,
              "seconds_full_length": full_seconds, "round_seconds_full_length": full_round_seconds,
              "cached_over_plain": over_plain, "cached_over_plain_full_length": over_plain_full, "cached_over_st_cached": over_st,
              "cached_over_st_cached_rounds": over_st_rounds,
              "cached_tokens_over_plain": tokens_over_plain,
              "cached_memory_growth": ratio(at(peaks, "cached", sizes[-1]), at(peaks, "cached", sizes[0])),
              "cached_memory_growth_full_length": ratio(at(full_peaks, "cached", sizes[-1]), at(full_peaks, "cached", sizes[0])),
              "plain_memory_growth": ratio(at(peaks, "plain", sizes[-1]), at(peaks, "plain", sizes[0]))}
    print(json.dumps(result))
    if args.out:
        write_record(args.out, device, result)


if __name__ == "__main__":
    main()
