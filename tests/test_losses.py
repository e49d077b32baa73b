"""Matryoshka losses on a real (tiny) encoder: one forward pass feeds every prefix and layer, gradients reach the model."""
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
