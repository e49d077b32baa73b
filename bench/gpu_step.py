"""Training and encoding at the GPU's pace: our trainer's step and encoder against the bare model and
sentence-transformers, side by side in one run, on any device.

    python bench/gpu_step.py [--device cuda] [--model embedded] [--data-dir DIR] [--batch-size 256] [--max-length 128]
                             [--rounds 12] [--warmup 2] [--encode-texts N] [--encode-batch-size 256]
                             [--encode-other-batch-sizes 64] [--out FILE]

Texts: the distinct STS-B and SICK-R test sentences, in order. Round k of every training setup takes the k-th batch our
trainer draws from the first B x (warmup + rounds) of them, so each step sees new texts (nothing cached), and all setups
see the same texts in the same round. Setups, at batch B (--batch-size) and max length L (--max-length):
  bare_fp32, bare_tf32, bare_bf16
        the Hugging Face model alone (the encoder's AutoModel): forward on the 2 x B token ids our SimCSE step passes
        through the encoder (the B texts twice, padded to the batch's longest, truncated at L; tokenised before timing,
        both views in one pass), loss = mean of the last hidden state, backward, AdamW. fp32; fp32 with TF32 matmuls
        (torch.set_float32_matmul_precision("high") for that step only); bf16 autocast.
  M, M_noamp  for M in base, mrl, 2dmse, ese, mipic, mic
        one optimizer step of our Trainer (method M, SimCSE objective, batch B, max_length L), `trainer.step += 1;
        trainer.train_step()` as Trainer.fit runs it, tokenisation included; amp True (the default: autocast on CUDA,
        ignored on the CPU) and amp False. A fresh Trainer per setup; all share the one loaded model with the bare setups
        (lr 0 for the bare setup, and the trainers' schedules are in their warm-up, so the weights barely move).
  st_fp32, st_bf16
        sentence-transformers' MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), dims 384..16) on (anchor,
        positive) = (the B texts, the same B texts), tokenised inside the step as its trainer does (preprocess + to the
        device, per column), loss(features, None), backward, AdamW; fp32, and the forward under bf16 autocast. Its own
        copy of the model.
  enc_ours_P_bS, enc_st_fp32_bS, enc_st_bf16_bS
        one pass over --encode-texts texts (default: all of them) at batch S: Encoder.encode(layers=[-1], precision P)
        for P in fp32, bf16, auto, and tf32 (fp32 with TF32 matmuls); SentenceTransformer.encode in fp32, and on a bf16 copy of its model.
Every round times one step (one pass, for encode) of each setup in turn, the order rotating (the machine's speed drifts);
an encode setup's timed pass follows an untimed one of its own, as a user encoding in one precision meets it (a pass
right after another setup's can pay for the switch: bf16 and auto, the same code, have differed 1.7x that way);
the --warmup rounds first are not counted; figures are medians over --rounds. On CUDA every clock read waits for the
GPU (torch.cuda.synchronize). Weights are upcast to float32 after loading (bench/device_payload.py saves them in fp16).
mrl_pretokenised: an mrl trainer whose every batch was tokenised (and pinned) before the rounds: mrl minus it is what
making the next batch in the background costs a step.
mrl_thread: an mrl trainer making its next batch in a background thread (batch_workers 0) where mrl uses the default
(a worker process on CUDA, which shares no interpreter lock with the step; on the CPU the default is that thread).
mrl_consecutive: after the rounds, --rounds steps of the mrl trainer back to back, as Trainer.fit runs them (each next
batch tokenised in the background while one trains; in the rounds that work overlaps the other setups' steps).
ese_batched_eigh: an ese trainer whose layers' eigendecompositions run in torch's one batched call
(ese_projection(side_by_side=False)) where ese runs them side by side: ese_batched_eigh_over_ese is what that saves.
ese_given_targets: an ese trainer whose compression targets are computed once and then reused, the decomposition
skipped (every other term as ese): ese_given_targets_over_mrl is ESE's step with its exact decomposition apart.
--variants (CUDA only: inductor's compile takes minutes on a CPU) adds two mrl trainers as above, each on its own copy
of the model (the other setups stay eager): mrl_compiled (TrainConfig.compile: torch.compile of the model, default mode)
and mrl_cudagraphs (mode reduce-overhead: CUDA graphs). Their compiles and graph captures happen in the warm-up rounds or,
for a new sequence length, in the round that meets it (the median absorbs those; the compiler's worker processes slow
the other setups too, so compare the goals from a run without --variants).
compute_dtype: what the first Linear layer of the model computed in, seen in the first warm-up round (amp's dtype).
The last line is one JSON object: the ratios and whether each goal is met, the medians, the device and versions; --out
also writes it with what made it. X_over_Y is X's time over Y's (st_over_mrl: sentence-transformers' best of fp32 and
bf16 over our mrl with the default amp), except encode_*, throughputs: encode_ours_over_st is our best precision's texts/s
over sentence-transformers' best at --encode-batch-size, encode_bf16_over_fp32 ours in bf16 over fp32 (> 1: bf16 faster).
"""
import argparse
import copy
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings

import torch

from matryoshka_lab import losses as losses_module
from matryoshka_lab.config import TrainConfig
from matryoshka_lab.core import provenance, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder, resolve_model
from matryoshka_lab.losses import ese_projection
from matryoshka_lab.methods import Callback, TrainData
from matryoshka_lab.runs import write_json
from matryoshka_lab.batches import pin_batch
from matryoshka_lab.trainer import Trainer
from timing import clock                          # bench/ is the script's folder

TASKS = ("stsb", "sickr")                       # their test sentences (bench/device_payload.py carries these tasks)
METHODS = ("base", "mrl", "2dmse", "ese", "mipic", "mic")
DIMS = (16, 32, 64, 128, 256, 384)
PRECISIONS = ("fp32", "bf16", "auto")
GOALS = {"mrl_over_bare_bf16": ("<=", 1.3), "st_over_mrl": (">=", 2.5), "2dmse_over_mrl": ("<=", 1.15),
         "ese_over_mrl": ("<=", 1.2), "mipic_over_mrl": ("<=", 1.5), "mic_over_mrl": ("<=", 1.25),
         "encode_ours_over_st": (">=", 1.2)}


def log(message):
    print(message, file=sys.stderr, flush=True)


def bare_step(model, opt, batches, device, dtype=None, matmul="highest"):
    "The model alone on tokenised batches: forward (autocast to dtype, if any), mean last hidden state, backward, AdamW."
    def step(k):
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(matmul)          # "high": TF32 matmuls on CUDA, backward included
        try:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(**batches[k]).last_hidden_state.float().mean()
            loss.backward()
            opt.step()
        finally:
            torch.set_float32_matmul_precision(before)
    return step


def trainer_step(trainer):
    "One step as Trainer.fit runs it (step k of the run draws the trainer's batch k)."
    def step(k):
        trainer.step += 1
        trainer.train_step()
    return step


def with_projection(step, projection):
    "step with ESE's compression target (losses.ese_projection, which ESE calls) replaced by projection(x, k)."
    def run(k):
        before = losses_module.ese_projection
        losses_module.ese_projection = projection
        try:
            step(k)
        finally:
            losses_module.ese_projection = before
    return run


def given_targets():
    "ese_projection computed once per input shape and then reused: the step's work without the decomposition."
    made = {}
    def projection(x, k):
        key = (tuple(x.shape), k)
        if key not in made:
            made[key] = ese_projection(x, k)
        return made[key]
    return projection


def st_step(st, loss, opt, batch_texts, device, dtype=None):
    "sentence-transformers' training step: tokenise both columns, move them to the device, the loss, backward, AdamW."
    from sentence_transformers.util import batch_to_device
    def step(k):
        opt.zero_grad(set_to_none=True)
        features = [batch_to_device(st.preprocess(batch_texts[k]), device) for _ in ("anchor", "positive")]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            value = loss(features, None)
        value.backward()
        opt.step()
    return step


def ours_pass(enc, texts, batch_size, precision, tf32=False):
    "One Encoder.encode pass; tf32: precision fp32 with TF32 matmuls (torch.backends.cuda.matmul.allow_tf32) for the pass."
    def run(k):
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32 or before
        try:
            return enc.encode(texts, batch_size=batch_size, layers=[-1], precision=precision, progress=False)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return run


def st_pass(model, texts, batch_size):
    return lambda k: model.encode(texts, batch_size=batch_size, show_progress_bar=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--model", default="embedded", help="embedded, or a model folder (bench/device_payload.py's model/)")
    p.add_argument("--data-dir", default=None, help="default: $MATRYOSHKA_LAB_DATA")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="rounds run first and not counted")
    p.add_argument("--encode-texts", type=int, default=None, help="texts per encode pass (default: all)")
    p.add_argument("--encode-batch-size", type=int, default=256, help="the goals' encode batch size")
    p.add_argument("--encode-other-batch-sizes", type=int, nargs="*", default=[64], help="also timed")
    p.add_argument("--variants", action="store_true", help="also the compiled and CUDA-graph mrl trainers (CUDA only)")
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    if args.batch_size < 2 or args.rounds < 1 or args.warmup < 0:
        p.error("--batch-size must be at least 2, --rounds at least 1, --warmup 0 or more")
    if args.variants and resolve_device(args.device).type != "cuda":
        p.error("--variants runs on CUDA only (inductor's compile takes minutes on a CPU)")
    made = provenance("python bench/gpu_step.py " + shlex.join(sys.argv[1:]))    # the code that runs: its commit now
    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import losses as st_losses
    import sentence_transformers
    import transformers
    device = resolve_device(args.device)
    B, L, n_rounds = args.batch_size, args.max_length, args.warmup + args.rounds
    started = time.perf_counter()

    tasks = [load_task(t, args.data_dir) for t in TASKS]
    texts = list(dict.fromkeys(s for t in tasks for s in t.test.sentence1 + t.test.sentence2))
    enc_texts = texts[:args.encode_texts]
    need = B * n_rounds
    if need > len(texts):
        log(f"only {len(texts)} distinct sentences for {need} (B x rounds): later batches repeat texts")
    train_texts = (texts * -(-need // len(texts)))[:need]

    torch.manual_seed(0)
    enc = Encoder.from_pretrained(args.model, device=device)
    enc.model.float()                                      # a payload's fp16 weights: every setup starts from float32
    st = SentenceTransformer(resolve_model(args.model), device=str(device)).float()
    st_enc = copy.deepcopy(st).eval()                      # encoding copies: the training one truncates at L
    st_enc_bf16 = copy.deepcopy(st_enc).to(torch.bfloat16)
    st.max_seq_length = L
    dims = [d for d in DIMS if d <= enc.hidden_size]
    log(f"{device}: {len(texts)} sentences, B {B}, L {L}; model loaded in {time.perf_counter() - started:.0f}s")

    setups, trainers, run_dir = {}, {}, tempfile.TemporaryDirectory(prefix="gpu_step_")   # nothing is written there
    def make_trainer(method, encoder, **options):
        cfg = TrainConfig(method=method, objective="simcse", batch_size=B, max_length=L, device=str(device),
                          dims=tuple(dims), eval_every=-1, diagnostics_every=-1, run_dir=run_dir.name,
                          max_steps=1_000_000, **options)
        trainer = Trainer(cfg, encoder=encoder, data=TrainData(train_texts), drop=(Callback,), progress=False)
        if trainer.loss_module is not None:
            trainer.loss_module.train()
        return trainer
    for method in METHODS:
        for amp in (True, False):
            trainers[method if amp else f"{method}_noamp"] = make_trainer(method, enc, amp=amp)
    trainers["mrl_thread"] = make_trainer("mrl", enc, batch_workers=0)
    ese_variants = {"ese_batched_eigh": lambda x, k: ese_projection(x, k, side_by_side=False),
                    "ese_given_targets": given_targets()}
    trainers.update({name: make_trainer("ese", enc) for name in ese_variants})
    trainers["mrl_pretokenised"] = pretokenised = make_trainer("mrl", enc)
    pin = pin_batch if device.type == "cuda" else lambda batch: batch
    ahead = [pin(pretokenised.prepare(k)) for k in range(n_rounds)]   # round k's batch, tokenised and pinned before timing
    pretokenised.batches = ahead.__getitem__
    if args.variants:                                      # each variant on a copy: the setups above stay eager
        trainers["mrl_compiled"] = make_trainer("mrl", copy.deepcopy(enc), compile=True)
        graphed = copy.deepcopy(enc)
        graphed.model.compile(mode="reduce-overhead")
        trainers["mrl_cudagraphs"] = make_trainer("mrl", graphed)
        for t in (trainers["mrl_compiled"], trainers["mrl_cudagraphs"]):
            t.encoder.train()
    enc.train()
    # every setup's round k: the texts of our trainers' batch k (the same seed, so the same batches in all of them)
    batch_texts = [[train_texts[i] for i in trainers["mrl"].batch_indices(k)] for k in range(n_rounds)]
    bare_batches = [{key: torch.cat([v, v]) for key, v in enc.tokenize(b, L).items()} for b in batch_texts]
    bare_opt = torch.optim.AdamW(enc.model.parameters(), lr=0.0)     # lr 0: the same work, the same weights
    setups["bare_fp32"] = bare_step(enc.model, bare_opt, bare_batches, device)
    setups["bare_tf32"] = bare_step(enc.model, bare_opt, bare_batches, device, matmul="high")
    setups["bare_bf16"] = bare_step(enc.model, bare_opt, bare_batches, device, dtype=torch.bfloat16)
    setups.update({name: trainer_step(t) for name, t in trainers.items()})
    setups.update({name: with_projection(setups[name], fn) for name, fn in ese_variants.items()})
    st.train()
    st_loss = st_losses.MatryoshkaLoss(st, st_losses.MultipleNegativesRankingLoss(st), matryoshka_dims=dims[::-1])
    st_opt = torch.optim.AdamW(st.parameters(), lr=0.0)
    setups["st_fp32"] = st_step(st, st_loss, st_opt, batch_texts, device)
    setups["st_bf16"] = st_step(st, st_loss, st_opt, batch_texts, device, dtype=torch.bfloat16)
    for bs in [args.encode_batch_size] + args.encode_other_batch_sizes:
        for prec in PRECISIONS:
            setups[f"enc_ours_{prec}_b{bs}"] = ours_pass(enc, enc_texts, bs, prec)
        setups[f"enc_ours_tf32_b{bs}"] = ours_pass(enc, enc_texts, bs, "fp32", tf32=True)
        for prec, model in (("fp32", st_enc), ("bf16", st_enc_bf16)):
            setups[f"enc_st_{prec}_b{bs}"] = st_pass(model, enc_texts, bs)

    # what each setup computes in: the dtype out of each model's first Linear, seen in the first (warm-up) round
    seen, compute_dtype = [], {}
    record = lambda module, inputs, out: seen.append(str(out.dtype).replace("torch.", ""))
    hooks = [next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(record)
             for model in ((enc.model, st, st_enc, st_enc_bf16) if args.warmup else ())]
    names = list(setups)
    times = {n: [] for n in names}
    for r in range(n_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seen.clear()
            if name.startswith("enc_"):
                setups[name](r)                            # untimed: the switch from the setup before is paid here
            t0 = clock(device)
            setups[name](r)
            t = clock(device) - t0
            if r >= args.warmup:
                times[name].append(t)
            elif r == 0:
                compute_dtype[name] = seen[-1] if seen else None
        if r == 0:
            for h in hooks:
                h.remove()
        log(f"  round {r + 1}/{n_rounds}{' (warm-up)' if r < args.warmup else ''} done at "
            f"{time.perf_counter() - started:.0f}s")
    # Trainer.fit's steady state: --rounds consecutive steps of one trainer, each next batch prepared while one runs
    t0 = clock(device)
    for _ in range(args.rounds):
        setups["mrl"](0)
    mrl_consecutive = (clock(device) - t0) / args.rounds
    run_dir.cleanup()

    med = {n: statistics.median(v) for n, v in times.items()}
    per = {n: len(enc_texts) if n.startswith("enc_") else B for n in names}       # texts per step or pass
    print(f"{'setup':22s} {'ms':>9s} {'min':>9s} {'max':>9s} {'texts/s':>10s}  computes in")
    for n in names:
        print(f"{n:22s} {med[n] * 1e3:9.1f} {min(times[n]) * 1e3:9.1f} {max(times[n]) * 1e3:9.1f} "
              f"{per[n] / med[n]:10.0f}  {compute_dtype.get(n)}")
    bs = args.encode_batch_size
    ours_enc = {p: med[f"enc_ours_{p}_b{bs}"] for p in PRECISIONS}
    st_enc_t = {p: med[f"enc_st_{p}_b{bs}"] for p in ("fp32", "bf16")}
    ratios = {"mrl_over_bare_bf16": med["mrl"] / med["bare_bf16"],
              "st_over_mrl": min(med["st_fp32"], med["st_bf16"]) / med["mrl"],     # ST's best vs our default amp
              **{f"{m}_over_mrl": med[m] / med["mrl"] for m in ("2dmse", "ese", "mipic", "mic")},
              "encode_ours_over_st": min(st_enc_t.values()) / min(ours_enc.values()),   # best vs best, throughput
              "encode_bf16_over_fp32": ours_enc["fp32"] / ours_enc["bf16"],
              "mrl_consecutive_over_mrl": mrl_consecutive / med["mrl"],
              "mrl_pretokenised_over_mrl": med["mrl_pretokenised"] / med["mrl"],
              "mrl_thread_over_mrl": med["mrl_thread"] / med["mrl"],
              "ese_batched_eigh_over_ese": med["ese_batched_eigh"] / med["ese"],
              "ese_given_targets_over_mrl": med["ese_given_targets"] / med["mrl"]}
    variants = {f"{v}_over_{ref}": med[v] / med[ref] for v in ("mrl_compiled", "mrl_cudagraphs") if v in med
                for ref in ("mrl", "bare_bf16")}
    met = {k: ratios[k] <= goal if op == "<=" else ratios[k] >= goal for k, (op, goal) in GOALS.items()}
    for k, v in variants.items():
        print(f"{k:26s} {v:6.3f}  (a variant)")
    for k, v in ratios.items():
        goal = (f"goal {GOALS[k][0]} {GOALS[k][1]}: {'met' if met[k] else 'NOT met'}" if k in GOALS else
                "> 1: bf16 faster" if k.startswith("encode") else "mrl's steps back to back, as fit runs them"
                if k.startswith("mrl_consecutive") else "its next batch made in a thread" if k.startswith("mrl_thread")
                else "the decompositions in one batched call" if k.startswith("ese_batched")
                else "ESE without its decomposition" if k.startswith("ese_given")
                else "its batches made before timing")
        print(f"{k:26s} {v:6.3f}  ({goal})")
    result = {**{k: round(v, 3) for k, v in ratios.items()},
              "goals_met": met, "goals": {k: f"{op} {goal}" for k, (op, goal) in GOALS.items()},
              "encode_best": {"ours": min(ours_enc, key=ours_enc.get), "st": min(st_enc_t, key=st_enc_t.get)},
              "variants": {k: round(v, 3) for k, v in variants.items()},
              "amp_off_over_on": {m: round(med[f"{m}_noamp"] / med[m], 3) for m in METHODS},
              "median_ms": {n: round(v * 1e3, 2) for n, v in med.items()},
              "texts_per_s": {n: round(per[n] / v, 1) for n, v in med.items()},
              "compute_dtype": compute_dtype,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
                        f"CPU ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "sentence_transformers": sentence_transformers.__version__,
              "batch_size": B, "max_length": L, "rounds": args.rounds, "warmup": args.warmup,
              "encode_texts": len(enc_texts), "encode_batch_size": bs,
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
