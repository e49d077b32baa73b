"""Encoder: every architecture, checked against independent computations (one text at a time, sentence-transformers)."""
import inspect
import socket
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import ARCHS, POST_NORM
from matryoshka_lab.core import hub_reachable
from matryoshka_lab.encoder import Encoder, ModelNotAvailableError, embedded_model_path, load_hf, pool

TEXTS = ["a tiny sentence", "", "another, somewhat longer sentence about nested dolls and prefixes",
         "x", "the quick brown fox jumps over the lazy dog", "matryoshka"]


def manual_pool(model, tokenizer, text, how):
    "Pool every hidden state of one unpadded text with plain indexing: [L+1, D]."
    ids = tokenizer([text], return_tensors="pt")
    accepted = inspect.signature(model.forward).parameters   # e.g. GPT-2 takes the BERT tokenizer's token_type_ids
    kwargs = {k: v for k, v in ids.items() if k in accepted}
    with torch.no_grad():
        states = model(**kwargs, output_hidden_states=True).hidden_states
    h = torch.stack(states)[:, 0]                     # [L+1, T, D]
    return {"mean": h.mean(1), "cls": h[:, 0], "last": h[:, -1]}[how]


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_one_at_a_time(arch, tiny_encoder, tokenizer):
    pooling = "last" if arch in ("gpt2", "llama") else "mean"
    enc = tiny_encoder(arch, pooling)
    got = enc.encode(TEXTS, batch_size=4, progress=False)        # length-sorted, padded batches
    assert got.shape == (enc.num_layers + 1, len(TEXTS), enc.hidden_size)
    ref = torch.stack([manual_pool(enc.model, tokenizer, t, pooling) for t in TEXTS], dim=1)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_truncated_reproduces_first_layers(arch, tiny_encoder):
    enc = tiny_encoder(arch)
    full = enc.encode(TEXTS, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = enc.truncated(2)
    assert small.num_layers == 2 and enc.num_layers == 3           # the original is untouched
    part = small.encode(TEXTS, progress=False)
    assert part.shape[0] == 3
    torch.testing.assert_close(part[:2], full[:2], atol=2e-5, rtol=1e-4)
    if arch in POST_NORM:  # pre-norm models apply their final norm to whichever state is last
        torch.testing.assert_close(part[2], full[2], atol=2e-5, rtol=1e-4)
    shared = {p.data_ptr() for p in enc.model.parameters()}
    assert all(p.data_ptr() in shared for p in small.model.parameters()), "truncation copied weights"
    if arch == "albert":
        assert any("no single stack" in str(w.message) for w in caught)
    else:
        n_layers = sum(1 for _ in small.model.modules())
        assert n_layers < sum(1 for _ in enc.model.modules()), "truncated model still holds every layer"


def test_embedded_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer
    texts = ["A man is playing a guitar.", "Two dogs run through a field of tall grass on a sunny day.",
             "The central bank raised interest rates by half a point.", "hi"]
    st = SentenceTransformer(str(embedded_model_path()), device="cpu")
    ref = st.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    enc = Encoder.from_pretrained("embedded")
    assert (enc.pooling, enc.max_length, enc.num_layers, enc.hidden_size) == ("mean", 256, 6, 384)
    ours = enc.encode(texts, layers="-1", progress=False)[0]
    torch.testing.assert_close(torch.nn.functional.normalize(ours, dim=-1), ref, atol=1e-5, rtol=1e-4)


def test_forward_tokens_and_attentions(tiny_encoder):
    enc = tiny_encoder("bert")
    batch = enc.tokenize(TEXTS[:3])
    out = enc(**batch, layers=[0, -1], tokens=True, attentions=True)
    B, T = batch["input_ids"].shape
    assert out.layers == [0, 3]
    assert out.hidden.shape == (2, B, T, 32) and out.pooled.shape == (2, B, 32)
    assert len(out.attentions) == 3 and out.attentions[0].shape == (B, 4, T, T)
    torch.testing.assert_close(out.pooled, pool(out.hidden, batch["attention_mask"], "mean"))
    # gradients flow (the trainer will use forward directly)
    out.pooled.sum().backward()
    assert enc.model.embeddings.word_embeddings.weight.grad is not None


def test_encode_errors(tiny_encoder):
    enc = tiny_encoder("bert")
    with pytest.raises(ValueError, match="texts is empty: nothing to encode"):
        enc.encode([])
    with pytest.raises(ValueError, match="texts must be a list of strings, not one string"):
        enc.encode("one string")
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        enc.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match=r"layer 4 is out of range: the model has 3 layers \(valid: 0..3"):
        enc.encode(["a"], layers=[4])
    with pytest.raises(ValueError, match="pooling must be one of"):
        Encoder(enc.model, enc.tokenizer, pooling="max")


def test_layer_subset_and_order(tiny_encoder):
    enc = tiny_encoder("bert")
    full = enc.encode(TEXTS, progress=False)
    sub = enc.encode(TEXTS, layers="3,1", progress=False)
    torch.testing.assert_close(sub, full[[3, 1]])


def test_load_local_folder(tiny_model_dir):
    enc = Encoder.from_pretrained(tiny_model_dir)
    assert enc.num_layers == 3 and enc.pooling == "mean"
    assert enc.encode(["hello"], progress=False).shape == (4, 1, 32)


def test_missing_folder_and_offline_hub_id_fail_clearly(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="does not exist"):
        load_hf(str(tmp_path / "nope"))
    with pytest.raises(ModelNotAvailableError, match="holds no Hugging Face model"):
        load_hf(str(tmp_path))
    code = ("from matryoshka_lab.encoder import load_hf\n"
            "try:\n    load_hf('some-org/not-cached-model')\nexcept ValueError as e:\n    print('ERR', e)\n")
    for env in ({"HF_HUB_OFFLINE": "1"}, {}):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**__import__("os").environ, **env})
        assert "ERR model 'some-org/not-cached-model' is not a local folder, not in the Hugging Face cache" in res.stdout, res.stderr[-2000:]
        assert "Use 'embedded'" in res.stdout


def test_hub_reachable_probes_the_endpoint(monkeypatch, hub_env_cleared):
    "The Hub counts as reachable when its endpoint ($HF_ENDPOINT) accepts a connection, or behind a proxy (not probed)."
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_reachable()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert not hub_reachable()                   # switched off: not even probed
        monkeypatch.delenv("HF_HUB_OFFLINE")
    assert not hub_reachable()                       # the port is closed now: refused
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert hub_reachable()
