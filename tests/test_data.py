"""Data loaders: every registered task from the shared data, plain files, the Hub path, and bad input."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from matryoshka_lab.data import (TASKS, ClassificationData, HierarchyData, PairData, RetrievalData, STSData, Sentences,
                                 load_hub, load_task, read_table, sts_from_frame)

# Rows per evaluated / training split, from shared/data's README files (SICK-R: train + trial + test, as MTEB).
EXPECTED = {"stsb": (1379, 5749), "stsb_dev": (1500, 0), "sickr": (9927, 0), "sts12": (3108, 0), "sts13": (1500, 0), "sts14": (3750, 0),
            "sts15": (3000, 0), "sts16": (1186, 0), "banking77": (3080, 10003), "emotion": (2000, 16000),
            "tweeteval_emotion": (1421, 3257), "tweeteval_sentiment": (12284, 2000), "mrpc": (1725, 4076),
            "clinc150": (4500, 15000), "trec": (500, 5452), "20newsgroups": (7532, 11314), "wos": (211, 789),
            "arxiv": (416, 1584), "wiki_sents": (14750, 0), "mipic_corpus": (14041, 0),
            "arxiv_title_abstract": (2000, 0), "mrpc_paraphrase": (1147, 0), "stsb_paraphrase": (309, 0),   # retrieval: queries
            "clinc150_intents": (4500, 0), "banking77_intents": (3080, 0)}
TYPES = {"sts": STSData, "pair": PairData, "classification": ClassificationData, "hierarchy": HierarchyData,
         "sentences": Sentences, "retrieval": RetrievalData}


@pytest.mark.parametrize("name", [n for n in TASKS if not n.startswith("builtin")])
def test_every_task_loads(name, data_dir):
    task = load_task(name, data_dir)
    assert isinstance(task.test, TYPES[task.kind])
    if name in EXPECTED:
        assert (len(task.test), len(task.train) if task.train is not None else 0) == EXPECTED[name]
    if task.kind == "hierarchy":
        assert len(task.test.levels) >= 2
        assert all(t.strip() for t in task.test.text[:200])


def test_hierarchy_labels(data_dir):
    clinc = load_task("clinc150", data_dir)
    assert clinc.test.levels == ["domain", "intent"]
    assert len(set(clinc.train.labels["domain"])) == 10 and len(set(clinc.train.labels["intent"])) == 150
    # every intent sits in exactly one domain
    pairs = set(zip(clinc.train.labels["intent"], clinc.train.labels["domain"]))
    assert len(pairs) == 150
    ng = load_task("20newsgroups", data_dir)
    assert all(t.strip() for t in ng.train.text), "empty 20NG bodies should fall back to the subject"
    wos = load_task("wos", data_dir)
    assert all("/" in a for a in wos.test.labels["area"])
    go = load_task("goemotions", data_dir)
    assert go.test.levels == ["sentiment", "ekman", "emotion"]
    assert len(go.train) == 36308  # single-label rows only


def test_missing_column_and_empty_split(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text(json.dumps({"sentence1": "a", "sentence2": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"missing column 'score' in .*pairs.jsonl \(it has: sentence1, sentence2\)"):
        sts_from_frame(read_table(p))
    (tmp_path / "empty.csv").write_text("sentence1,sentence2,score\n")
    with pytest.raises(ValueError, match="empty.csv' has no rows"):
        read_table(tmp_path / "empty.csv")
    with pytest.raises(ValueError, match="unsupported file type '.txt'"):
        (tmp_path / "x.txt").write_text("hi")
        read_table(tmp_path / "x.txt")


def test_missing_task_folder(tmp_path):
    with pytest.raises(ValueError, match="task 'banking77': folder .*banking77' is missing from the data directory"):
        load_task("banking77", tmp_path)


def test_unknown_task_and_bad_env(monkeypatch):
    with pytest.raises(ValueError, match="unknown task 'stsz'; known tasks: stsb"):
        load_task("stsz")
    monkeypatch.setenv("MATRYOSHKA_LAB_DATA", "/definitely/not/here")
    with pytest.raises(ValueError, match=r"from the \$MATRYOSHKA_LAB_DATA\) does not exist"):
        load_task("stsb")


def test_offline_without_data_dir(monkeypatch):
    monkeypatch.delenv("MATRYOSHKA_LAB_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="no data directory given and the Hub is switched off"):
        load_task("stsb")
    with pytest.raises(ValueError, match="task 'clinc150' has no Hugging Face Hub copy: give a data directory"):
        load_task("clinc150")


def test_load_hub_reads_a_local_datasets_folder(tmp_path):
    "The Hub loader's conversion path, exercised offline on a folder in the datasets layout."
    folder = tmp_path / "my_sts"
    folder.mkdir()
    rows = [{"sentence1": f"s{i}", "sentence2": f"t{i}", "score": float(i % 5)} for i in range(12)]
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = load_hub(str(folder), "test")
    data = sts_from_frame(df)
    assert len(data) == 12 and data.score[3] == 3.0


def test_load_hub_offline_error(monkeypatch, hub_env_cleared):
    "Switched off (HF_HUB_OFFLINE, read by the Hub's client at import: a fresh process) or unreachable: one clear error."
    code = "from matryoshka_lab.data import load_hub\nload_hub('mteb/no-such-set', 'test')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert "ValueError: could not load 'mteb/no-such-set' split 'test' from the Hugging Face Hub" in res.stderr, res.stderr[-2000:]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))                # a port nothing listens on once closed
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="split 'test' from the Hugging Face Hub: its host does not answer"):
        load_hub("mteb/no-such-set", "test")


def test_builtin_tasks_are_deterministic():
    a, b = load_task("builtin_sts"), load_task("builtin_sts")
    assert a.test.sentence1 == b.test.sentence1 and np.array_equal(a.test.score, b.test.score)
    assert a.test.sentence1 != a.train.sentence1
    intents = load_task("builtin_intents")
    assert set(intents.test.labels["intent"]) == set(intents.train.labels["intent"])
