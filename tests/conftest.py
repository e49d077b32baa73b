"""Shared fixtures: the shared data directory, and tiny seeded random transformers built from configs (no download)."""
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    "$MATRYOSHKA_LAB_DATA, else ../shared/data beside the repository (the CI layout), else None."
    env = os.environ.get("MATRYOSHKA_LAB_DATA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand.resolve()
    return None


@pytest.fixture(scope="session")
def data_dir():
    d = shared_data_dir()
    if d is None:
        pytest.skip("no data directory: set MATRYOSHKA_LAB_DATA or place shared/data beside the repository")
    return d


@pytest.fixture(scope="session")
def tokenizer():
    "The embedded model's BERT WordPiece tokenizer, reused by every tiny model (vocab 30522)."
    from transformers import AutoTokenizer
    from matryoshka_lab.encoder import embedded_model_path
    return AutoTokenizer.from_pretrained(str(embedded_model_path()), local_files_only=True)


# Tiny configs: 2-3 layers, 32 features, the BERT tokenizer's vocabulary, no dropout (deterministic forward).
TINY = dict(hidden=32, layers=3, heads=4, ffn=64, vocab=30522)

def tiny_config(arch: str):
    import transformers as tf
    h, L, a, f, v = TINY["hidden"], TINY["layers"], TINY["heads"], TINY["ffn"], TINY["vocab"]
    common = dict(vocab_size=v, pad_token_id=0)
    bert_like = dict(hidden_size=h, num_hidden_layers=L, num_attention_heads=a, intermediate_size=f,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=128, **common)
    if arch == "bert":
        return tf.BertConfig(**bert_like)
    if arch == "roberta":
        return tf.RobertaConfig(**bert_like)
    if arch == "electra":
        return tf.ElectraConfig(embedding_size=h, **bert_like)
    if arch == "deberta-v2":
        return tf.DebertaV2Config(**bert_like)
    if arch == "mpnet":
        return tf.MPNetConfig(**bert_like)
    if arch == "albert":
        return tf.AlbertConfig(embedding_size=16, **bert_like)
    if arch == "distilbert":
        return tf.DistilBertConfig(dim=h, n_layers=L, n_heads=a, hidden_dim=f, dropout=0.0, attention_dropout=0.0,
                                   max_position_embeddings=128, **common)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=h, n_layer=L, n_head=a, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, bos_token_id=101, eos_token_id=102, **common)
    if arch == "llama":
        return tf.LlamaConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=a, num_key_value_heads=2,
                              intermediate_size=f, max_position_embeddings=128,
                              bos_token_id=101, eos_token_id=102, **common)
    if arch == "t5":
        return tf.T5Config(d_model=h, d_kv=8, d_ff=f, num_layers=L, num_heads=a, dropout_rate=0.0,
                           decoder_start_token_id=0, **common)
    raise ValueError(arch)


ARCHS = ["bert", "roberta", "electra", "deberta-v2", "mpnet", "albert", "distilbert", "gpt2", "llama", "t5"]
POST_NORM = {"bert", "roberta", "electra", "deberta-v2", "mpnet", "albert", "distilbert"}  # last state has no extra norm


def tiny_model(arch: str, seed: int = 0):
    from transformers import AutoModel
    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_config(arch))
    if getattr(model.config, "is_encoder_decoder", False):
        model = model.get_encoder()
    return model.eval()


@pytest.fixture
def tiny_encoder(tokenizer):
    "Factory: tiny_encoder(arch, pooling) -> Encoder over a seeded random model."
    from matryoshka_lab.encoder import Encoder
    def make(arch="bert", pooling="mean"):
        return Encoder(tiny_model(arch), tokenizer, pooling=pooling, max_length=64)
    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    "A tiny BERT saved as a normal Hugging Face folder (for CLI and loading tests)."
    path = tmp_path_factory.mktemp("tiny_bert")
    tiny_model("bert").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def hub_env_cleared(monkeypatch):
    "No variable that switches the Hub off or routes it through a proxy (tests that probe its host set their own)."
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
