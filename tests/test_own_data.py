"""Your own data from a fresh clone, with no data directory: files the test writes itself, evaluated and trained on
through the command line as a user would, and each bad file refused in one error line before any work."""
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mrl.yaml"


def run(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "MATRYOSHKA_LAB_DATA"}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(["matryoshka-lab", *args], capture_output=True, text=True, timeout=900, env=env, cwd=cwd)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


TOPICS = {t: [f"{w} about {t}" for w in ("a question", "a remark", "a complaint", "a story", "news", "a joke")]
          for t in ("weather", "banking", "cooking", "travel", "music", "sports")}


@pytest.fixture
def own_files(tmp_path):
    "A pairs JSONL with two hard-negative columns, an STS CSV and a BEIR folder."
    topics = list(TOPICS)
    rows = []
    for t, texts in TOPICS.items():
        other = TOPICS[topics[(topics.index(t) + 1) % len(topics)]]
        for i, text in enumerate(texts):
            rows.append({"id": len(rows), "anchor": text, "positive": texts[(i + 1) % len(texts)],
                         "negative_1": other[i], "negative_2": other[(i + 2) % len(texts)]})
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    sts = tmp_path / "sts.csv"
    pd.DataFrame({"s1": ["a cat sits", "a man runs", "it rains", "the bank is closed"],
                  "s2": ["a cat is sitting", "a dog sleeps", "it is raining", "stocks fell today"],
                  "sim": [4.8, 0.5, 4.5, 1.0]}).to_csv(sts, index=False)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    write_jsonl(beir / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": t}
                                        for i, t in enumerate(t for texts in TOPICS.values() for t in texts)])
    write_jsonl(beir / "queries.jsonl", [{"_id": f"q{i}", "text": f"something about {t}"} for i, t in enumerate(TOPICS)])
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{6 * i + j}\t1\n" for i in range(len(TOPICS)) for j in range(6)))
    return {"pairs": pairs, "sts": sts, "beir": beir}


def test_own_files_are_evaluated_trained_on_and_found_again(own_files, tiny_model_dir, tmp_path):
    "eval --tasks PATH,PATH at every layer, dims and precisions; train on a pairs file with hard negatives; eval RUN_DIR finds its data."
    out = tmp_path / "grid.csv"
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", f"{own_files['beir']},{own_files['sts']},{own_files['pairs']}",
              "--columns", "s1=sentence1,s2=sentence2,sim=score", "--layers", "all", "--dims", "8,32",
              "--precisions", "float32,binary", "--out", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_csv(out)
    assert set(df.task) == {"beir", "sts", "pairs"} and sorted(df.layer.unique()) == [0, 1, 2, 3]
    assert set(df[df.task == "sts"].metric) == {"spearman"}
    assert {"ndcg_at_10", "ndcg_at_10/binary"} <= set(df[df.task == "pairs"].metric)
    assert len(df[(df.task == "beir") & (df.metric == "ndcg_at_10")]) == 4 * 2

    run_dir = tmp_path / "run"
    train = ["train", str(CONFIG), "--no-progress"] + [x for s in (
        f"train_task={own_files['pairs']}", "objective=infonce", f"model={tiny_model_dir}", f"run_dir={run_dir}",
        "max_steps=3", "batch_size=4", "dims=[8,32]", "checkpoint_every=0", f"eval_tasks=[{own_files['pairs']}]",
        "eval_layers=-1") for x in ("--set", s)]
    res = run(*train)
    assert res.returncode == 0, res.stderr[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train_task"] == str(own_files["pairs"].resolve())
    record = json.loads((run_dir / "data.json").read_text())
    assert record == {config["train_task"]: {"name": "pairs", "fingerprint": record[config["train_task"]]["fingerprint"]}}
    assert record[config["train_task"]]["fingerprint"].startswith("sha256:")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {m["name"] for m in metrics} >= {"deferred", "L3/d8/infonce", "pairs/L3/d8/ndcg_at_10"}

    from matryoshka_lab.workbench import build_app                     # the workbench opens the run on its file's rows
    assert build_app(tmp_path, "run").first_eval_task() == "pairs"
    res = run("eval", str(run_dir), "--out", str(tmp_path / "again.csv"), "--no-progress", cwd=tmp_path / "beir")
    assert res.returncode == 0 and "note:" not in res.stderr, res.stderr[-3000:]
    assert set(pd.read_csv(tmp_path / "again.csv").task) == {"pairs"}
    with open(own_files["pairs"], "a", encoding="utf-8") as f:               # the file changes: said, and a resume refused
        f.write(json.dumps({"anchor": "new", "positive": "row", "negative_1": "x", "negative_2": "y"}) + "\n")
    res = run("eval", str(run_dir), "--out", str(tmp_path / "again.csv"), "--no-progress")
    assert res.returncode == 0 and "has changed" in res.stderr, res.stderr[-3000:]
    res = run(*train)
    assert res.returncode == 2 and "which has changed since" in res.stderr, res.stderr[-3000:]


BAD = {
    "missing_column.csv": ("sentence1,sentence2\na,b\n", "fit no kind of task. Accepted: anchor, positive"),
    "empty.jsonl": ("", "has no rows"),
    "score.csv": ("sentence1,sentence2,score\na,b,1\nc,d,high\n", "line 3: 'score' has 'high', not a number"),
    "mixed.jsonl": ('{"anchor": "a", "positive": "b", "text": "c"}\n', "fit more than one kind (pairs and text)"),
    "rows.jsonl": ('{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n', "line 2: 'positive' has no value"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_file_is_one_error_line_before_any_work(name, tmp_path):
    "Evaluated or trained on: one `error:` line naming the problem, status 2, nothing written, no model loaded."
    text, message = BAD[name]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    res = run("eval", "--model", "no/such/model", "--tasks", str(path), "--out", str(tmp_path / "grid.csv"), "--no-progress")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.stderr
    res = run("train", str(CONFIG), "--set", f"train_task={path}", "--set", "objective=infonce", "--set", "model=no/such/model",
              "--set", f"run_dir={tmp_path / 'run'}", "--no-progress")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and message in lines[0], res.stderr
    assert not (tmp_path / "grid.csv").exists() and not (tmp_path / "run").exists()


def test_a_beir_qrel_naming_an_unknown_id_is_one_error_line(own_files, tmp_path):
    with open(own_files["beir"] / "qrels" / "test.tsv", "a") as f:
        f.write("q0\td999\t1\n")
    res = run("eval", "--model", "no/such/model", "--tasks", str(own_files["beir"]), "--out", str(tmp_path / "g.csv"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "names document 'd999', which is not in the corpus" in lines[0], res.stderr


def test_the_readmes_own_data_commands_run_as_written(tmp_path):
    "The README's 'Your own data' commands, verbatim, in a copy of configs/ and examples/, with no data directory."
    import shlex
    import shutil
    root = Path(__file__).resolve().parents[1]
    section = (root / "README.md").read_text(encoding="utf-8").split("## Your own data", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines() if line.strip()]
    assert len(commands) == 3 and all(c.startswith("matryoshka-lab ") for c in commands)
    for folder in ("configs", "examples"):
        shutil.copytree(root / folder, tmp_path / folder)
    for command in commands:
        res = run(*shlex.split(command)[1:], "--no-progress", cwd=tmp_path)
        assert res.returncode == 0, (command, res.stderr[-3000:])
    grid = pd.read_csv(tmp_path / "runs" / "own_mrl" / "grid.csv")
    assert set(grid.task) == {"faq_pairs"} and "ndcg_at_10" in set(grid.metric)
    assert set(pd.read_csv(tmp_path / "runs" / "own" / "grid.csv").task) == {"faq_pairs", "sts"}


def test_two_files_of_one_name_are_refused_before_the_model(own_files, tmp_path):
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / "sts.csv"
    copy.write_text(own_files["sts"].read_text())
    res = run("eval", "--model", "no/such/model", "--tasks", f"{own_files['sts']},{copy}", "--columns",
              "s1=sentence1,s2=sentence2,sim=score", "--out", str(tmp_path / "g.csv"))
    assert res.returncode == 2 and "tasks from different sources share the name 'sts'" in res.stderr, res.stderr


def test_several_datasets_train_in_one_run_each_batch_from_one(own_files, tiny_model_dir, tmp_path):
    "train_task: [pairs, more pairs] trains one run (round robin), records both files; datasets of other shapes are refused."
    more = write_jsonl(tmp_path / "more.jsonl", [{"anchor": f"query {i}", "positive": f"passage {i}", "negative": f"other {i}",
                                                  "negative_b": f"far {i}"} for i in range(12)])
    run_dir = tmp_path / "mixed"
    sets = [f"train_task=[{own_files['pairs']}, {more}]", "objective=infonce", f"model={tiny_model_dir}",
            f"run_dir={run_dir}", "max_steps=4", "batch_size=4", "dims=[8,32]", "eval_every=-1", "diagnostics_every=2"]
    res = run("train", str(CONFIG), "--no-progress", *[x for s in sets for x in ("--set", s)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((run_dir / "config.json").read_text())["train_task"] == [str(own_files["pairs"]), str(more)]
    assert set(json.loads((run_dir / "data.json").read_text())) == {str(own_files["pairs"]), str(more)}
    from matryoshka_lab.config import load_config
    from matryoshka_lab.recipe import training_data
    from matryoshka_lab.methods import BatchDraw
    cfg = load_config(run_dir / "config.json")
    data = training_data(cfg)
    draw = BatchDraw(data, 4, cfg.seed, True, cfg.train_mix)
    first = len(data) - 12
    assert [{i < first for i in draw(k)} for k in range(4)] == [{True}, {False}, {True}, {False}]
    res = run("train", str(CONFIG), "--no-progress", "--set", f"train_task=[{own_files['pairs']}, builtin_sts]",
              "--set", "objective=infonce", "--set", f"run_dir={tmp_path / 'refused'}", "--set", "model=no/such/model")
    assert res.returncode == 2 and "cannot share a run: they differ in negative columns (2 and 0)" in res.stderr, res.stderr
