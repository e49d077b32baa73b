"""Gradient caching (views.CachedViews, TrainConfig.mini_batch_size / mini_batch_tokens): every parameter's gradient
is the uncached step's, for every method under every objective, with dropout replayed, under autocast, and through
sentence-transformers' adapter."""
import copy

import numpy as np
import pytest
import torch

from conftest import tiny_config
from matryoshka_lab import views
from matryoshka_lab.batches import batch_target
from matryoshka_lab.config import make_config
from matryoshka_lab.encoder import Encoder, EncoderOutput
from matryoshka_lab.losses import info_nce
from matryoshka_lab.methods import Callback, TrainData, get_method
from matryoshka_lab.trainer import Trainer

N = 24
TEXTS = [f"request {i} about topic {i % 5}" + " with more words" * (i % 4) for i in range(N)]
DATA = {"simcse": TrainData(TEXTS),
        "infonce": TrainData(TEXTS, [f"an answer to {i}" + " at length" * (i % 3) for i in range(N)],   # hard negatives
                             negatives=([f"off topic {i}" for i in range(N)], [f"unrelated {i} " * (1 + i % 2) for i in range(N)])),
        "cosent": TrainData(TEXTS, [f"a reply {i}" for i in range(N)], np.linspace(0, 5, N).astype(np.float32))}
DATA["angle"] = DATA["cosent"]
TEACHER = (np.random.default_rng(0).normal(size=(N, 48)).astype(np.float32), np.arange(N) % 4)   # distill_nc: teacher, labels
CASES = [(m, o) for m in ("base", "mrl", "2dmse", "ese") for o in DATA] + [("distill_nc", "simcse")] + \
        [(m, o) for m in ("mipic", "mic") for o in ("simcse", "infonce")]


SHIFT_FREE = "attention.self.key.bias"   # softmax ignores a shift of all of a query's scores: zero gradient but for rounding


def worst(g: dict, ref: dict) -> float:
    "max over parameters of max|g - ref| / max|ref|, floored at 1e-6 of the largest gradient; key biases, whose gradient is zero in exact arithmetic, are only checked to be rounding (below that floor) in both."
    assert g.keys() == ref.keys()
    top = max(r.abs().max().item() for r in ref.values())
    floor = 1e-6 * top
    assert all(max(g[k].abs().max().item(), ref[k].abs().max().item()) <= floor for k in ref if SHIFT_FREE in k)
    return max((g[k] - ref[k]).abs().max().item() / max(ref[k].abs().max().item(), floor) for k in ref if SHIFT_FREE not in k)


def make_trainer(encoder, tmp_path, method, objective, **sets) -> Trainer:
    data = TrainData(TEXTS, target=TEACHER) if method == "distill_nc" else DATA[objective]
    cfg = make_config({"run_dir": str(tmp_path / "run"), "method": method, "objective": objective, "batch_size": 8,
                       "max_length": 16, "dims": [8, 16, 32], "eval_every": -1, "grad_clip": 0, **sets,
                       "loss_options": {"compression_size": 8} if method == "ese" else {}})
    return Trainer(cfg, encoder=encoder, data=data, progress=False, drop=(Callback,))


def gradients(trainer: Trainer) -> dict:
    "Every parameter's gradient: the encoder's and the loss's own."
    named = list(trainer.encoder.named_parameters())
    named += list(trainer.loss_module.named_parameters(prefix="loss")) if trainer.loss_module is not None else []
    return {n: p.grad.clone() for n, p in named if p.grad is not None}


def step_gradients(trainer: Trainer) -> tuple[float, dict]:
    "The loss and the gradients of the trainer's first step."
    trainer.step = 1
    try:
        loss = trainer.train_step()["loss"]
    finally:
        trainer.batches.close()
    return loss, gradients(trainer)


def longest_first(lengths: list[int], size: int) -> list[list[int]]:
    "Rows longest first (equal lengths in order), `size` at a time: the mini-batches the cached step cuts without a token budget."
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + size] for i in range(0, len(order), size)]


def in_place(parts: list[torch.Tensor], rows: list[list[int]]) -> torch.Tensor:
    "Mini-batches' outputs [..., b, ...] (rows along dim 1) joined with each row back in its place in the batch."
    return torch.cat(parts, 1)[:, torch.tensor(sum(rows, [])).argsort()]


def mini_batch_gradients(trainer: Trainer, size: int) -> dict:
    "The gradients of the uncached step over the mini-batches the cached step cuts (`longest_first`, each without its trailing padding; token-state methods' rows all at the batch's length, so in order), each encoded with a graph in the cached step's order."
    method, encoder = trainer.method, trainer.encoder
    rows, side_a, side_b = trainer.prepare(0)
    def encode(side):
        mask = side["attention_mask"]
        lengths = [mask.shape[1] if method.needs_tokens else int(m.nonzero().max()) + 1 for m in mask]
        outs, parts = [], longest_first(lengths, size)
        for part_rows in parts:
            part = {k: v[part_rows] for k, v in side.items()}
            if not method.needs_tokens:
                part = {k: v[:, :max(lengths[i] for i in part_rows)] for k, v in part.items()}
            outs.append(encoder(**part, tokens=method.needs_tokens))
        pooled = in_place([o.pooled for o in outs], parts)
        return EncoderOutput(pooled, outs[0].layers, mask, in_place([o.hidden for o in outs], parts)) \
            if method.needs_tokens else pooled
    a = encode(side_a)
    b = a if method.single_view else encode(side_b)
    loss = trainer.loss_fn(a, b, batch_target(rows, "cpu"), generator=torch.Generator().manual_seed(trainer.config.seed))
    loss.total.backward()
    return gradients(trainer)


@pytest.mark.parametrize("method,objective", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_the_cached_step_gives_the_plain_steps_gradients(method, objective, tiny_encoder, tokenizer, tmp_path, monkeypatch):
    "Same batch, same weights. Without dropout, against the one-pass step: the loss and every parameter's gradient, by rows and by a token budget. With dropout, against the uncached step over the same mini-batches from the same generator state (the trainer seeds it); without the replay, not."
    loss, plain = step_gradients(make_trainer(tiny_encoder("bert"), tmp_path, method, objective))
    for sets in ({"mini_batch_size": 3}, {"mini_batch_tokens": 40}, {"mini_batch_size": 2, "mini_batch_tokens": 40}):
        cached_loss, cached = step_gradients(make_trainer(tiny_encoder("bert"), tmp_path, method, objective, **sets))
        assert abs(cached_loss - loss) <= 1e-5 * abs(loss), (sets, cached_loss, loss)
        assert worst(cached, plain) <= 1e-5, (sets, worst(cached, plain))
    reference = mini_batch_gradients(make_trainer(dropout_encoder(tokenizer), tmp_path, method, objective), 3)
    for replay in (True, False):
        if not replay:
            monkeypatch.setattr(views, "set_rng_state", lambda state, device: None)
        _, cached = step_gradients(make_trainer(dropout_encoder(tokenizer), tmp_path, method, objective, mini_batch_size=3))
        assert worst(cached, reference) <= 1e-5 if replay else worst(cached, reference) > 1e-3, (replay, worst(cached, reference))


def dropout_encoder(tokenizer) -> Encoder:
    from transformers import AutoModel
    torch.manual_seed(0)
    config = tiny_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
    return Encoder(AutoModel.from_config(config).train(), tokenizer, pooling="mean", max_length=64)


def text_cuts(encoder, texts, size: int = 3) -> list[list[int]]:
    return longest_first([len(encoder.tokenize([t], 16)["input_ids"][0]) for t in texts], size)


def uncached_view(encoder, texts) -> torch.Tensor:
    "One view of texts by the uncached step: each of the cached step's mini-batches of 3 encoded with a graph, in its order."
    parts = text_cuts(encoder, texts)
    return in_place([encoder(**encoder.tokenize([texts[i] for i in rows], 16)).pooled for rows in parts], parts)


def replayed(encoder, texts) -> tuple[dict, dict]:
    "Gradients of SimCSE (two dropout views) by the uncached step over the same mini-batches of 3, and by CachedViews, each from seed 0."
    loss_of = lambda a, b: info_nce(a[-1], b[-1], scale=20.0)
    grads = lambda: {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
    torch.manual_seed(0)
    a = uncached_view(encoder, texts)
    b = uncached_view(encoder, texts)
    loss_of(a, b).backward()
    uncached = grads()
    encoder.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    cache = views.CachedViews(get_method("mrl"), encoder, texts, texts, 16, size=3)
    loss_of(*cache.views).backward()
    cache.backward()
    cached = grads()
    encoder.zero_grad(set_to_none=True)
    return uncached, cached


def test_dropout_is_replayed(tokenizer, monkeypatch):
    "With dropout on, the cached gradient is the uncached step's over the same mini-batches; without the replay it is not."
    encoder, texts = dropout_encoder(tokenizer), TEXTS[:8]
    uncached, cached = replayed(encoder, texts)
    assert worst(cached, uncached) <= 1e-5, worst(cached, uncached)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    with torch.no_grad():                   # the generator ends where the pass without a graph left it
        for _ in range(2):
            for rows in text_cuts(encoder, texts):
                encoder(**encoder.tokenize([texts[i] for i in rows], 16))
    assert torch.equal(after, torch.get_rng_state())
    monkeypatch.setattr(views, "set_rng_state", lambda state, device: None)
    _, broken = replayed(encoder, texts)
    assert worst(broken, uncached) > 1e-3, worst(broken, uncached)


def test_backward_reenters_the_autocast_the_views_were_made_in(tokenizer):
    "The mini-batches' second pass runs in bf16 when backward() is called outside autocast (as sentence-transformers' backward hook calls it), and its gradient is the uncached one to bf16's rounding."
    encoder, texts = dropout_encoder(tokenizer), TEXTS[:8]
    seen = []
    encoder.model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    amp = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    loss_of = lambda a, b: info_nce(a[-1], b[-1], scale=20.0)
    torch.manual_seed(0)
    with amp():
        cache = views.CachedViews(get_method("mrl"), encoder, texts, texts, 16, size=3)
        loss_of(*cache.views).backward()
    seen.clear()
    cache.backward()
    assert seen == [torch.bfloat16] * 5, seen          # 2 sides x 3 mini-batches, less the last one, kept from pass one
    cached = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
    encoder.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with amp():
        a = uncached_view(encoder, texts)
        b = uncached_view(encoder, texts)
        loss_of(a, b).backward()
    uncached = {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None}
    # bf16 sums in another order differ by ~1e-2 (two uncached forms, one autocast region or one per pass, by 4e-3)
    assert worst(cached, uncached) <= 3e-2, worst(cached, uncached)


def test_mini_batches_cover_every_row_once_within_their_limits():
    rng = np.random.default_rng(0)
    for _ in range(50):
        ends = rng.integers(2, 40, size=int(rng.integers(1, 30))).tolist()
        size, tokens = int(rng.integers(1, 9)), int(rng.integers(40, 200))
        for cuts in (views.mini_batches(ends, size), views.mini_batches(ends, size, tokens), views.mini_batches(ends, None, tokens)):
            assert sorted(sum(cuts, [])) == list(range(len(ends))) and all(cuts)
        assert all(len(c) <= size for c in views.mini_batches(ends, size, tokens))
        assert all(len(c) == 1 or len(c) * max(ends[i] for i in c) <= tokens for c in views.mini_batches(ends, None, tokens))
        for cut in (views.mini_batches(ends, size), views.mini_batches(ends, size, tokens)):   # longest first
            rows = sum(cut, [])
            assert [ends[i] for i in rows] == sorted(ends, reverse=True)
            assert all(rows.index(i) < rows.index(j) for i in range(len(ends)) for j in range(i + 1, len(ends)) if ends[i] == ends[j])
        assert [len(c) for c in views.mini_batches(ends, size)] == [size] * (len(ends) // size) + [len(ends) % size] * (len(ends) % size > 0)


def test_mini_batch_settings_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="mini_batch_size must be at least 1"):
        make_config({"mini_batch_size": 0})
    with pytest.raises(ValueError, match="mini_batch_tokens must hold one text of max_length 32 tokens, got 16"):
        make_config({"mini_batch_tokens": 16})


def test_the_adapter_caches_as_sentence_transformers_does(tmp_path):
    "MatryoshkaLabLoss(mini_batch_size=...) in sentence-transformers' step: its uncached gradient, and theirs (MatryoshkaLoss of CachedMultipleNegativesRankingLoss) on the same batch."
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (CachedMultipleNegativesRankingLoss, MatryoshkaLoss,
                                                                   MultipleNegativesRankingLoss)
    from matryoshka_lab.encoder import embedded_model_path
    from matryoshka_lab.st_loss import MatryoshkaLabLoss
    base = SentenceTransformer(str(embedded_model_path()), device="cpu")
    for m in base.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    data = DATA["infonce"]
    columns, dims = [data.text_a[:8], data.text_b[:8], data.negatives[0][:8]], [16, 32, 64, 128, 256, 384]
    def gradients(make_loss):
        model = copy.deepcopy(base).train()
        total = make_loss(model)([model.preprocess(c) for c in columns], None)
        total.backward()
        return total.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ours = lambda **sets: lambda model: MatryoshkaLabLoss(model, "mrl", {"reduction": "sum"}, "infonce", dims=dims, **sets)
    loss, plain = gradients(ours())
    for sets in ({"mini_batch_size": 3}, {"mini_batch_tokens": 40}):
        cached_loss, cached = gradients(ours(**sets))
        assert abs(cached_loss - loss) <= 1e-5 * loss and worst(cached, plain) <= 1e-5, (sets, worst(cached, plain))
    st_loss, st_cached = gradients(lambda model: MatryoshkaLoss(model, CachedMultipleNegativesRankingLoss(model, mini_batch_size=3), dims))
    _, st_plain = gradients(lambda model: MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), dims))
    # three float paths through one function: theirs cached against theirs plain sets the scale of the rounding
    assert abs(st_loss - loss) <= 1e-5 * loss and worst(cached, st_cached) <= 2 * max(worst(st_cached, st_plain), 1e-5)
