"""The matryoshka-lab command, run as a user would: in a subprocess."""
import json
import os
import subprocess

import pandas as pd
import pytest


def run(*args, env=None, timeout=600):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(["matryoshka-lab", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def test_eval_writes_tidy_csv_and_plots(tiny_model_dir, tmp_path):
    out = tmp_path / "grid.csv"
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", "builtin_sts,builtin_intents", "--layers", "all",
              "--dims", "8,16,32", "--out", str(out), "--plot", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_csv(out)
    assert list(df.columns) == ["task", "layer", "dim", "metric", "value"]
    assert sorted(df.layer.unique()) == [0, 1, 2, 3] and sorted(df.dim.unique()) == [8, 16, 32]
    metrics = set(df[df.task == "builtin_intents"].metric)
    assert metrics == {f"{m}_{lvl}" for m in ("knn_acc", "recall@1", "recall@10") for lvl in ("domain", "intent")}
    assert len(df) == 4 * 3 * (1 + 6)
    assert (tmp_path / "grid.html").stat().st_size > 10_000 and (tmp_path / "grid.png").stat().st_size > 10_000


def test_eval_on_shared_data(tiny_model_dir, tmp_path, data_dir):
    out = tmp_path / "trec.json"
    res = run("eval", "--model", str(tiny_model_dir), "--data-dir", str(data_dir), "--tasks", "trec,mrpc",
              "--layers", "-1", "--dims", "32", "--out", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.DataFrame(json.loads(out.read_text()))
    assert list(df.columns) == ["task", "layer", "dim", "metric", "value"]
    assert {"knn_acc_coarse", "knn_acc_fine", "accuracy", "ap"} <= set(df.metric)
    assert df.layer.unique().tolist() == [3]


@pytest.mark.parametrize("args, message", [
    (["--layers", "9"], "error: layer 9 is out of range: the model has 3 layers (valid: 0..3, or -1 for the last)"),
    (["--dims", "64"], "error: dim 64 exceeds the model's hidden size 32"),
    (["--tasks", "nope"], "error: unknown task 'nope'; known tasks:"),
])
def test_eval_argument_errors(tiny_model_dir, tmp_path, args, message):
    base = {"--tasks": "builtin_sts", "--layers": "all", "--dims": "8"}
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    res = run("eval", "--model", str(tiny_model_dir), *flat, "--out", str(tmp_path / "x.csv"), "--no-progress")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(message)
    assert not (tmp_path / "x.csv").exists()


def test_eval_unknown_model_offline(tmp_path):
    res = run("eval", "--model", "someone/missing-model", "--tasks", "builtin_sts", "--out", str(tmp_path / "x.csv"),
              env={"HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2
    assert "error: model 'someone/missing-model' is not a local folder" in res.stderr


def test_demo_falls_back_to_builtin_corpus(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "MATRYOSHKA_LAB_DATA": ""}
    res = run("demo", "--out", str(tmp_path / "demo"), "--no-progress", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "built-in generated corpus" in res.stdout and "not a benchmark" in res.stdout
    assert "builtin_sts: spearman" in res.stdout
    for name in ("grid.csv", "grid.html", "grid.png"):
        assert (tmp_path / "demo" / name).stat().st_size > 0
    meta = json.loads((tmp_path / "demo" / "meta.json").read_text())
    assert meta["command"] == f"matryoshka-lab demo --out {tmp_path / 'demo'}"
    assert meta["tasks"] == ["builtin_sts", "builtin_intents"] and meta["data"].startswith("the built-in generated corpus")
    assert meta["n_texts"] > 0 and meta["library_version"] and meta["precision"] == "fp32"


def test_eval_without_tasks_or_run_dir_says_what_it_needs(tmp_path):
    res = run("eval", "--no-progress")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "error: eval needs --tasks and --out (or a run directory: matryoshka-lab eval RUN_DIR)"
    res = run("eval", str(tmp_path), "--no-progress")
    assert res.returncode == 2 and "has no config.json" in res.stderr


def test_fractal_writes_json(tiny_model_dir, tmp_path):
    out = tmp_path / "fractal.json"
    res = run("fractal", "--model", str(tiny_model_dir), "--dataset", "builtin_intents", "--seeds", "2", "--epochs", "1",
              "--conditions", "v5,mrl,inverted", "--workers", "2", "--out", str(out), "--no-progress",
              env={"MATRYOSHKA_LAB_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["dataset"], r["seeds"], r["conditions"]) == ("builtin_intents", [42, 123], ["v5", "mrl", "inverted"])
    assert r["levels"] == ["domain", "intent"] and r["n_classes"] == [5, 15] and r["dims"] == [64, 128, 192, 256]
    assert r["split"]["n_train"] + r["split"]["n_val"] == 300 and r["split"]["n_test"] == 90
    assert len(r["runs"]) == 6 and {(x["condition"], x["seed"]) for x in r["runs"]} == \
        {(c, s) for c in ("v5", "mrl", "inverted") for s in (42, 123)}
    for x in r["runs"]:   # S recomputed from the stored grid (Eq. 1); accuracies are fractions of the 90 test rows
        a0, a1 = x["acc"]["L0"], x["acc"]["L1"]
        assert abs(x["S"] - ((a0[0] - a0[3]) + (a1[3] - a1[0]))) < 1e-9
        assert all(abs(v * 90 - round(v * 90)) < 1e-6 for v in a0 + a1)
    for c in ("v5", "mrl", "inverted"):
        S = [x["S"] for x in r["runs"] if x["condition"] == c]
        assert r["summary"][c]["S"] == S and abs(r["summary"][c]["S_mean"] - (S[0] + S[1]) / 2) < 1e-12
    assert set(r["stats"]) == {"v5_vs_mrl", "vs_v5"}
    assert (r["protocol"], r["evaluation"]) == ("authors", "loo500")   # the default protocol; S under every evaluation
    assert all(set(x["S_by_eval"]) == {"loo500", "loo_test", "train_index"} and x["S"] == x["S_by_eval"]["loo500"] for x in r["runs"])
    assert "steerability S (Eq. 1)" in res.stdout and "v5 - mrl" in res.stdout
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.npy"))) == 1   # the backbone ran once, through the cache


@pytest.mark.parametrize("args, message", [
    (["--dataset", "stsb"], "error: task 'stsb' is of kind 'sts': fractal training needs a hierarchy task"),
    (["--dataset", "builtin_intents", "--seeds", "0"], "error: --seeds must be at least 1, got 0"),
    (["--dataset", "builtin_intents", "--conditions", "v5,flat"],
     "error: unknown condition 'flat'; conditions are v5, mrl, inverted, no_prefix, uhmt"),
    (["--dataset", "builtin_intents", "--epochs", "0"], "error: epochs must be at least 1, got 0"),
    (["--dataset", "builtin_intents", "--workers", "0"], "error: workers must be at least 1, got 0"),
    ([], "matryoshka-lab fractal: error: the following arguments are required: --dataset"),
])
def test_fractal_argument_errors(tmp_path, args, message):
    res = run("fractal", *args, "--out", str(tmp_path / "f.json"), "--no-progress")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(message), res.stderr
    assert not (tmp_path / "f.json").exists()


def test_fractal_out_must_be_json(tmp_path):
    res = run("fractal", "--dataset", "builtin_intents", "--out", str(tmp_path / "f.csv"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == f"error: --out must be a .json file, got {str(tmp_path / 'f.csv')!r}"


@pytest.mark.parametrize("override, message", [
    ("method=mlr", "error: method must be one of ('base', 'mrl', '2dmse', 'ese', 'mipic', 'mic', 'distill_nc') or "
                   "'package.module:Attribute' naming a Method, got 'mlr'"),
    ("method=no_such_package.methods:Mine", "error: method 'no_such_package.methods:Mine': importing module "
                                            "'no_such_package.methods' failed (ModuleNotFoundError"),
    ("method=matryoshka_lab.losses:Nope", "error: method 'matryoshka_lab.losses:Nope': module 'matryoshka_lab.losses' "
                                          "has no attribute 'Nope'"),
    ("loss_options.alpah=1", "error: unknown mipic loss option 'alpah'; known: alpha, anchor, att_tau"),
])
def test_train_method_errors(tmp_path, override, message):
    "A bad method name, a method module that does not import, an unknown option: one error line, status 2, nothing written."
    config = os.path.join(os.path.dirname(__file__), "..", "configs", "mipic.yaml")
    res = run("train", config, "--set", override, "--set", f"run_dir={tmp_path / 'run'}", "--no-progress")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert not (tmp_path / "run").exists()


def test_eval_in_bf16_is_close_to_fp32(tmp_path):
    "--precision bf16 runs the forward pass in bfloat16: every cell within half a point of fp32's, and not identical."
    common = ["--tasks", "builtin_sts", "--layers", "0,-1", "--dims", "16,384", "--no-progress"]
    grids = {}
    for precision in ("fp32", "bf16"):
        res = run("eval", *common, "--precision", precision, "--out", str(tmp_path / f"{precision}.csv"))
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Loading weights" not in res.stderr and "it/s]" not in res.stderr, res.stderr   # --no-progress: no bar
        grids[precision] = pd.read_csv(tmp_path / f"{precision}.csv").set_index(["task", "layer", "dim", "metric"]).value
    diff = (grids["bf16"] - grids["fp32"]).abs()
    assert len(diff) == 4 and diff.max() < 0.5 and diff.max() > 0, diff
    res = run("eval", *common, "--precision", "fp16", "--out", str(tmp_path / "x.csv"))
    assert res.returncode == 2 and "invalid choice: 'fp16'" in res.stderr
