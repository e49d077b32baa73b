"""Matryoshka losses on a real (tiny) encoder: one forward pass feeds every prefix and layer, gradients reach the model."""
import dataclasses

import pytest
import torch

from conftest import tiny_config
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.losses import ESE, MRL, TwoDMSE, angle, cosent, info_nce

TEXTS = ["a man plays guitar", "a woman reads a book", "the market fell sharply", "dogs run in the park",
         "it will rain tomorrow", "she cooked pasta for dinner"]


@pytest.fixture
def dropout_encoder(tokenizer):
    from transformers import AutoModel
    torch.manual_seed(0)
    cfg = tiny_config("bert")
    cfg.hidden_dropout_prob = 0.1
    return Encoder(AutoModel.from_config(cfg), tokenizer, max_length=32).train()


@pytest.mark.parametrize("loss", [MRL(info_nce, dims=(8, 16, 32)), TwoDMSE(info_nce, dims=(8, 16)),
                                  ESE(info_nce, compression_size=16)], ids=lambda l: l.name)
def test_unsupervised_simcse_step_reaches_every_layer(loss, dropout_encoder):
    batch = dropout_encoder.tokenize(TEXTS)
    view1 = dropout_encoder(**batch).pooled            # [L+1, B, D]: every hidden state from one pass
    view2 = dropout_encoder(**batch).pooled            # a second dropout view (SimCSE)
    assert not torch.allclose(view1, view2), "dropout should make the two views differ"
    out = loss(view1, view2, generator=torch.Generator().manual_seed(0), **({"layer": 1} if loss.name == "2dmse" else {}))
    assert torch.isfinite(out.total) and out.parts
    out.total.backward()
    layers = dropout_encoder.model.encoder.layer
    assert dropout_encoder.model.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert layers[0].attention.self.query.weight.grad.abs().sum() > 0
    assert layers[-1].output.dense.weight.grad.abs().sum() > 0   # every loss trains the last layer


def test_part_names_follow_the_convention():
    a, b = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    parts = TwoDMSE(cosent, dims=(8, 16))(a, b, torch.arange(6.0), layer=1, dim=8).parts
    assert set(parts) == {"L3/d32/cosent", "L1/d32/cosent", "L3/d8/cosent", "L1/d8/cosent", "L1/align"}
    parts = MRL(angle, dims=(8, 32))(a, b, torch.arange(6.0)).parts
    assert set(parts) == {"L3/d8/angle", "L3/d32/angle"}


def test_dim_sampling_keeps_the_full_size():
    a, b = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    mrl = MRL(info_nce, dims=(4, 8, 16, 32), n_dims_per_step=2)
    seen = set()
    for seed in range(20):
        parts = mrl(a, b, generator=torch.Generator().manual_seed(seed)).parts
        assert len(parts) == 2 and "L1/d32/info_nce" in parts
        seen |= set(parts)
    assert len(seen) == 4, "every dim should be drawn sometimes"


def test_the_batched_forms_run_off_the_cpu(monkeypatch):
    """Off the CPU, MRL's prefixes, 2DMSE's and ESE's layers and MIPIC's PIC steps take their batched forms, which CI
    has no GPU to run: on the meta device (shapes without values) each loss, built as the trainer builds it (its
    objective a closure over the temperature), runs forward and backward through them, and MRL, 2DMSE and ESE name
    their parts as the CPU's loops do."""
    from matryoshka_lab import losses, mipic
    from matryoshka_lab.config import make_config
    from matryoshka_lab.recipe import make_loss
    calls = []
    def spy(name, fn):
        def called(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return called
    for name in ("simcse", "cosent", "angle"):                        # the objectives make_loss looks up by name
        objective = losses.OBJECTIVES[name]
        monkeypatch.setitem(losses.OBJECTIVES, name, dataclasses.replace(objective, prefixes=spy("prefixes", objective.prefixes)))
    monkeypatch.setattr(ESE, "stacked_terms", spy("stacked_terms", ESE.stacked_terms))
    monkeypatch.setattr(TwoDMSE, "stacked_terms", spy("stacked_terms", TwoDMSE.stacked_terms))
    monkeypatch.setattr(mipic, "info_nce_stacked", spy("info_nce_stacked", losses.info_nce_stacked))

    def pooled(device):
        g = torch.Generator().manual_seed(0)
        return [torch.randn(4, 6, 16, generator=g).to(device).requires_grad_() for _ in range(2)]

    for method, objective, form in (("mrl", "simcse", "prefixes"), ("mrl", "cosent", "prefixes"),
                                    ("mrl", "angle", "prefixes"), ("2dmse", "simcse", "stacked_terms"),
                                    ("2dmse", "angle", "stacked_terms"), ("ese", "simcse", "stacked_terms"),
                                    ("ese", "angle", "stacked_terms")):
        cfg = make_config({"method": method, "objective": objective, "dims": [4, 8, 16],
                           "loss_options": {"compression_size": 4} if method == "ese" else {}})
        loss = make_loss(cfg, hidden_size=16, num_layers=3)
        score = None if objective == "simcse" else torch.arange(6.0)
        torch.manual_seed(0)                                            # 2DMSE's layer and prefix draws
        cpu = loss(*pooled("cpu"), score)
        assert not calls, (method, objective, calls)                 # the CPU keeps its loops
        a, b = pooled("meta")
        torch.manual_seed(0)
        res = loss(a, b, None if score is None else score.to("meta"))
        assert calls == [form] and res.total.device.type == "meta", (method, objective, calls)
        assert list(res.parts) == list(cpu.parts), (method, objective)
        res.total.backward()
        assert a.grad.shape == a.shape, (method, objective)
        calls.clear()
    chain = mipic.MIPIC(info_nce, (4, 8, 16), hidden_size=16, num_layers=3)
    z = [x[-1, :, :d] for x, d in zip(pooled("cpu"), (4, 8))] + [pooled("cpu")[0][-1]]
    assert mipic.pic_terms(z, chain.projectors).shape == (2,) and not calls
    z = [x.detach().to("meta").requires_grad_() for x in z]
    terms = mipic.pic_terms(z, chain.to("meta").projectors)
    assert calls == ["info_nce_stacked"] and terms.shape == (2,) and terms.device.type == "meta"
    terms.sum().backward()
    assert all(x.grad.shape == x.shape for x in z)
