"""Trainer: CLI runs of every method, crash and resume with identical losses, two processes = one, a diverging loss,
config mistakes."""
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from matryoshka_lab.checkpoint import latest_checkpoint
from matryoshka_lab.config import config_changes, load_config, make_config
from matryoshka_lab import encoder as encoder_module
from matryoshka_lab.encoder import Encoder, ModelNotAvailableError, resolve_model
from matryoshka_lab.methods import CancelFit, Callback, TrainData
from matryoshka_lab.runs import read_run
from matryoshka_lab.batches import BatchesAhead
from matryoshka_lab.trainer import CheckpointCallback, Trainer
from matryoshka_lab.views import method_views

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def extra_installed(model: str) -> bool:
    try:
        resolve_model(model)
        return True
    except ModelNotAvailableError:
        return False


def train_cmd(config, run_dir, *sets):
    return ["matryoshka-lab", "train", str(config), "--no-progress", "--set", f"run_dir={run_dir}", *sum((["--set", s] for s in sets), [])]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_config_trains_through_the_cli(config, tiny_model_dir, tmp_path):
    load_config(config)   # the shipped file itself is valid
    sets = [f"model={tiny_model_dir}", "max_steps=3", "batch_size=8", "checkpoint_every=2", "eval_tasks=[builtin_sts]",
            "dims=[8,16,32]"] + (["loss_options.compression_size=16"] if config.stem == "ese" else [])
    if load_config(config).loss_options.get("teacher") == "mpnet" and not extra_installed("mpnet"):
        sets.append("loss_options.teacher=embedded")   # the optional extra is not here: the same run with the default teacher
    if "angle" in config.stem:
        sets.append("train_task=builtin_sts")
    else:
        sets.append("train_task=builtin_intents")
    res = subprocess.run(train_cmd(config, tmp_path / "run", *sets), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run = read_run(tmp_path / "run")
    assert sorted(run.metrics[run.metrics.name == "loss"].step) == [1, 2, 3]
    assert run.config["method"] == load_config(config).method
    assert (tmp_path / "run" / "grid.csv").is_file() and "builtin_sts: spearman" in res.stdout
    assert any(n.startswith("builtin_sts/L3/d32/") for n in run.metrics[run.metrics.split == "eval"].name)
    # the exported folder declares what the method trained as embeddings, and its card shows the last evaluation
    method = load_config(config).method
    expected = {"base": (None, None), "distill_nc": (None, None), "ese": ([16, 32], [1, 2, 3]),
                "2dmse": ([8, 16, 32], [1, 2, 3])}.get(method, ([8, 16, 32], None))
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert (saved.get("matryoshka_dimensions"), saved.get("matryoshka_layers")) == expected, (method, saved)
    assert "| builtin_sts: spearman, layer \\ dim |" in (tmp_path / "run" / "model" / "README.md").read_text()
    # the exported model evaluates like any model folder, and `eval RUN_DIR` picks the run's own settings
    own = (tmp_path / "run" / "grid.csv").read_bytes()
    res = subprocess.run(["matryoshka-lab", "eval", str(tmp_path / "run"), "--no-progress"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    # ... beside the run's own grid.csv (its model card's table), which it leaves as it was and refuses to overwrite
    assert (tmp_path / "run" / "grid.csv").read_bytes() == own and (tmp_path / "run" / "eval" / "grid.csv").is_file()
    used = json.loads((tmp_path / "run" / "data_used.json").read_text())      # what the run trained and was evaluated on
    assert used["train"]["from"] == "config" and used["eval"] == [{"task": "builtin_sts", "kind": "sts", "source": "generated"}]
    if config.stem == "mrl":
        res = subprocess.run(["matryoshka-lab", "eval", str(tmp_path / "run"), "--out", str(tmp_path / "run" / "grid.csv"),
                              "--no-progress"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and "is the run's own evaluation (its model card's table)" in res.stderr, res.stderr[-2000:]


def losses(run_dir):
    m = read_run(run_dir).metrics
    return m[(m.split == "train") & (m.name == "loss")].set_index("step").value


def test_killed_run_resumes_with_the_same_losses(tmp_path):
    "SIGKILL mid-run, start again: it resumes from the last checkpoint and every later loss equals the uninterrupted run."
    sets = ["train_task=builtin_intents", "max_steps=12", "batch_size=16", "checkpoint_every=4", "eval_every=-1",
            "max_length=24", "method=2dmse", "dims=[32,128]"]
    config = ROOT / "configs" / "2dmse.yaml"
    ref = subprocess.run(train_cmd(config, tmp_path / "ref", *sets), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]

    run_dir = tmp_path / "crash"
    proc = subprocess.Popen(train_cmd(config, run_dir, *sets), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:   # a second process reading the live run directory
        seen = losses(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        if len(seen) >= 6:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and int(ckpt.name.split("_")[1]) in (4, 8)

    res = subprocess.run(train_cmd(config, run_dir, *sets), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = losses(tmp_path / "ref"), losses(run_dir)
    assert list(b.index) == list(range(1, 13))
    torch.testing.assert_close(torch.tensor(b.values), torch.tensor(a.values), rtol=0, atol=1e-6)
    deferred = [m[m.name == "deferred"].set_index("step").value for m in (read_run(d).metrics for d in (tmp_path / "ref", run_dir))]
    assert deferred[0].sum() > 0 and deferred[0].equals(deferred[1])   # the duplicate-free draw deferred rows, the same ones


@pytest.mark.parametrize("sets", [
    ["method=2dmse", "objective=simcse", "train_task=builtin_intents", "grad_accum=2"],   # in-batch negatives + KL
    ["method=ese", "objective=cosent", "train_task=builtin_sts", "loss_options={compression_size: 16}"],  # ranking + batch SVD
    ["method=mic", "objective=simcse", "train_task=builtin_intents"],   # token states gathered, padded per process
    # + the loss's own parameters (P_i, phi_i): every process must train rank 0's draw of phi_i (drawn from each process's
    # seed, the step-1 gradient norm was 0.3 % off; the [CLS] anchor hid it: this model's [CLS] states are all alike,
    # so PIC's gradient there is 1e-2 and under the tolerance). The pooled anchor, the default, is the one that shows it
    ["method=mipic", "objective=simcse", "train_task=builtin_intents"],
    # hard negatives: each process's side b is its positives then its negatives; gathered, they must stand block by block
    ["method=mrl", "objective=infonce_symmetric", "train_task=PAIRS"],
    # gradient caching (11_views) in the two processes only: mini-batches of the leaves the gather passes gradients to
    ["method=mrl", "objective=infonce_symmetric", "train_task=PAIRS", "two:mini_batch_size=3"],
    ["method=mipic", "objective=simcse", "train_task=builtin_intents", "two:mini_batch_tokens=40"],
], ids=["2dmse-simcse-accum", "ese-cosent", "mic-tokens", "mipic-params", "mrl-hard-negatives", "mrl-hard-negatives-cached",
        "mipic-cached"])
def test_two_processes_give_the_one_process_losses(sets, tiny_model_dir, tmp_path):
    "torchrun with 2 gloo processes, each encoding half of the global batch, follows the one-process loss curve (`two:` settings: the two processes' only)."
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": f"question {i} about topic {i % 5}", "positive": f"answer {i} on {i % 5}",
                                         "negative_1": f"an answer off topic {i}", "negative_2": f"unrelated text {i}"}) + "\n"
                             for i in range(40)))
    common = [f"model={tiny_model_dir}", "max_steps=6", "batch_size=8", "checkpoint_every=3", "eval_every=-1",
              "dims=[8,16,32]", *(s.replace("PAIRS", str(pairs)) for s in sets if not s.startswith("two:"))]
    config = ROOT / "configs" / "mrl.yaml"
    one = subprocess.run(train_cmd(config, tmp_path / "one", *common), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    only_two = [s[len("two:"):] for s in sets if s.startswith("two:")]
    two = subprocess.run(train_cmd(config, tmp_path / "two", *common, *only_two) + ["--nproc", "2"], capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(b.index) == list(range(1, 7))   # float tolerance: summation order differs (MIPIC's loss is ~30)
    torch.testing.assert_close(torch.tensor(b.values), torch.tensor(a.values), rtol=1e-5, atol=1e-5)
    # every logged part and the gradient norm too (Adam alone would hide a gradient off by a constant factor)
    m1, m2 = (read_run(tmp_path / d).metrics.set_index(["step", "name"]).value for d in ("one", "two"))
    assert set(m1.index) == set(m2.index) and "grad_norm" in set(m1.index.get_level_values(1))
    torch.testing.assert_close(torch.tensor(m2[m1.index].values), torch.tensor(m1.values), rtol=1e-5, atol=1e-5)
    from safetensors.torch import load_file
    w1, w2 = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("one", "two"))
    for k in w1:   # Adam moves a weight with a near-zero gradient by about +-lr whatever its sign: allow a few lr
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-4)
    state = torch.load(latest_checkpoint(tmp_path / "two") / "state.pt", weights_only=True)
    assert len(state["rng"]["torch_ranks"]) == 2   # each process's dropout generator is saved for the resume
    assert two.stdout.count("Run directory:") == 1   # rank 0 alone reports (and writes)


def test_nproc_must_divide_the_batch(tmp_path):
    res = subprocess.run(train_cmd(ROOT / "configs" / "mrl.yaml", tmp_path, "batch_size=8") + ["--nproc", "3"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == "error: batch_size 8 (the global batch) must be divisible by --nproc 3"


def test_nproc_checks_the_eval_tasks_before_its_processes_start(tmp_path):
    "A task with nothing to score under --nproc 2: one error line from this process, no worker started, no model loaded."
    (tmp_path / "one.csv").write_text("sentence1,sentence2,score\na cat sits,a cat is sitting,4.8\n")
    res = subprocess.run(train_cmd(ROOT / "configs" / "mrl.yaml", tmp_path / "run", "batch_size=8",
                                   f"eval_tasks=[{tmp_path / 'one.csv'}]") + ["--nproc", "2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "processes (torchrun)" not in res.stdout, res.stdout + res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == ("error: eval_tasks: task 'one' has 1 scored pair(s): Spearman's correlation "
                                                   "needs two pairs or more with different scores (evaluation scores STS, "
                                                   "classification, pair, hierarchy and retrieval tasks)"), res.stderr[-2000:]
    assert not (tmp_path / "run").exists()


class CancelAt(Callback):
    "Stop training cleanly after step `at` (what an interrupted session looks like to the run directory)."
    def __init__(self, at):
        self.at = at
    def after_step(self, trainer):
        if trainer.step == self.at:
            raise CancelFit


def assert_stopped_run_resumes_like(ref, cfg, data, make_encoder, run):
    "Stop a run at step 3, start it again on the same run_dir: its losses and loss parameters equal the uninterrupted ref's."
    first = Trainer(make_config({**cfg, "run_dir": run}), encoder=make_encoder(), data=data, progress=False,
                    callbacks=[CheckpointCallback(0), CancelAt(3)]).fit()
    assert first.step == 3 and latest_checkpoint(run).name == "step_0000003"
    second = Trainer(make_config({**cfg, "run_dir": run}), encoder=make_encoder(), data=data, progress=False).fit()
    for p_ref, p_new in zip(ref.loss_module.parameters(), second.loss_module.parameters()):
        torch.testing.assert_close(p_new, p_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.tensor(losses(run).values), torch.tensor(losses(ref.config.run_dir).values),
                               rtol=0, atol=1e-6)


def test_a_loss_with_parameters_resumes_with_the_same_losses(tiny_encoder, tmp_path):
    "MIPIC's projections are trained with the encoder and travel in the checkpoint: stop at 3, resume, same losses."
    cfg = {"method": "mipic", "max_steps": 6, "batch_size": 4, "dims": [8, 16, 32], "eval_every": -1,
           "checkpoint_every": 0, "lr": 1e-3}
    data = TrainData([f"sentence number {i} of the corpus" for i in range(40)])
    ref = Trainer(make_config({**cfg, "run_dir": str(tmp_path / "ref")}), encoder=tiny_encoder("bert"), data=data,
                  progress=False).fit()
    assert ref.loss_module is not None and any(p.requires_grad for p in ref.loss_module.parameters())
    assert_stopped_run_resumes_like(ref, cfg, data, lambda: tiny_encoder("bert"), str(tmp_path / "run"))


def test_loss_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown mrl loss option 'alpha'; known: n_dims_per_step, reduction, weights"):
        make_config({"method": "mrl", "loss_options": {"alpha": 0.5}})
    with pytest.raises(ValueError, match="unknown mic loss option 'alpha'; known: "):
        make_config({"method": "mic", "loss_options": {"alpha": 0.5}})
    with pytest.raises(ValueError, match="unknown 2dmse loss option 'dims'; known: alignment, detach_target, "):
        make_config({"method": "2dmse", "loss_options": {"dims": [8]}})
    from matryoshka_lab.recipe import make_loss
    with pytest.raises(ValueError, match="kl_temperature must be positive, got -1"):       # a bad value: the loss class's own check
        make_loss(make_config({"method": "ese", "loss_options": {"kl_temperature": -1}}), 384, 6)
    two = make_loss(make_config({"method": "2dmse", "loss_options": {"alignment": "similarity", "kl_temperature": 0.3}}), 384, 6)
    assert (two.alignment, two.kl_temperature, two.detach_target) == ("similarity", 0.3, True)
    assert make_loss(make_config({"method": "ese", "loss_options": {"compress": False}}), 384, 6).compress is False


def test_top_level_option_keys_keep_working(tmp_path):
    "The six option keys that were top-level config keys move under loss_options, with the new spelling in a FutureWarning."
    with pytest.warns(FutureWarning, match="write loss_options.kl_temperature"):
        cfg = make_config({"method": "2dmse"}, ["kl_temperature=0.3"])
    assert cfg.loss_options == {"kl_temperature": 0.3}
    with pytest.raises(ValueError, match=r"compression_size is an option of method ese \(loss_options.compression_size\), not of 'mrl'"):
        make_config({"method": "mrl", "compression_size": 16})
    old = {**make_config({"method": "ese", "loss_options": {"compression_size": 16}}).to_dict(), "run_dir": str(tmp_path)}
    del old["loss_options"]                       # a config.json written before the move: every legacy key at top level
    old.update(loss_options={}, compression_size=16, kl_temperature=None, n_dims_per_step=None, teacher="embedded",
               teacher_layer=-1, label_level=None)
    (tmp_path / "config.json").write_text(json.dumps(old))
    same = make_config({"method": "ese", "run_dir": str(tmp_path), "loss_options": {"compression_size": 16}})
    assert config_changes(tmp_path, same) == []   # a run saved with the old keys resumes under the new spelling
    assert config_changes(tmp_path, make_config({"method": "ese", "run_dir": str(tmp_path)})) == ["loss_options"]


class Poison(Callback):
    "Fault injection: turn the loss into NaN at one step."
    def __init__(self, step):
        self.at = step
    def after_loss(self, trainer):
        if trainer.step == self.at:
            trainer.out.total = trainer.out.total * float("nan")


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_checkpoint(tiny_encoder, tmp_path):
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 5, "batch_size": 4, "dims": [8, 32], "eval_every": -1})
    data = TrainData([f"sentence number {i}" for i in range(40)])
    trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, callbacks=[CheckpointCallback(2), Poison(3)],
                      progress=False)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3 .* step_0000002 holds the weights that gave it: "
                                                 "moved aside to diverged_step_0000002. No checkpoint whose weights"):
        trainer.fit()
    assert latest_checkpoint(tmp_path) is None and (tmp_path / "checkpoints" / "diverged_step_0000002").is_dir()
    assert sorted(losses(tmp_path).index) == [1, 2]


def test_the_final_evaluation_says_what_it_does(tiny_encoder, tmp_path, capsys):
    "With progress on, the evaluation after the last step (eval_every 0) prints what it evaluates and its progress, as the ones during training do: it once printed nothing for minutes."
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 2, "batch_size": 4, "dims": [8, 32], "eval_every": 0,
                       "checkpoint_every": 0, "eval_tasks": ["builtin_sts"]})
    Trainer(cfg, encoder=tiny_encoder("bert"), data=TrainData([f"sentence number {i}" for i in range(40)])).fit()
    err = capsys.readouterr().err
    assert "step 2: evaluating builtin_sts" in err, err[-2000:]
    assert err.index("step 2: evaluating") > err.rindex("train mrl")          # after the training bar closed


def test_resume_refuses_a_different_config(tiny_encoder, tmp_path):
    data = TrainData([f"sentence number {i}" for i in range(40)])
    base = {"run_dir": str(tmp_path), "max_steps": 2, "batch_size": 4, "dims": [8, 32], "eval_every": -1}
    Trainer(make_config(base), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    with pytest.raises(ValueError, match="holds a run with a different config \\(lr\\)"):
        Trainer(make_config({**base, "lr": 1e-3}), encoder=tiny_encoder("bert"), data=data, progress=False).fit()


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: mrl\nbatchsize: 3\n")
    with pytest.raises(ValueError, match="unknown config key 'batchsize'"):
        load_config(bad)
    res = subprocess.run(["matryoshka-lab", "train", str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("error: unknown config key 'batchsize'")
    with pytest.raises(ValueError, match="batch_size must be at least 2"):
        make_config({"batch_size": 1})
    with pytest.raises(ValueError, match="objective 'cosent' needs scored pairs"):
        from matryoshka_lab.recipe import training_data
        training_data(make_config({"objective": "cosent", "train_task": "builtin_intents"}))


class RecomputeDistill(Callback):
    "After each loss: the same objective recomputed by hand from the batch's texts and its rows of the teacher table."
    def __init__(self):
        self.gaps = []
    def after_loss(self, trainer):
        idx = trainer.batch_indices(trainer.step - 1)
        data, enc = trainer.data, trainer.encoder
        with torch.no_grad():   # the tiny models have no dropout: the forward is deterministic
            student = enc(**enc.tokenize([data.text_a[i] for i in idx], trainer.config.max_length)).pooled[-1]
            teacher, label = data.rows(idx)
            again = trainer.loss_fn.distill(student, torch.as_tensor(teacher), torch.as_tensor(label))
        self.gaps.append(abs(again.total.item() - trainer.out.total.item()))


def test_distill_nc_trains_with_orthonormal_projections_and_resumes(tiny_encoder, tmp_path):
    "distill_nc on a tiny student: teacher rows looked up per batch, P P^T = I after training, a stopped run resumes exactly."
    import numpy as np
    rng = np.random.default_rng(0)
    data = TrainData([f"request number {i} about topic {i % 4}" for i in range(40)],
                     target=(rng.normal(size=(40, 48)).astype(np.float32), np.arange(40) % 4))
    cfg = {**load_config(ROOT / "configs" / "distill_nc.yaml").to_dict(),   # the shipped config, CPU-test sized
           "max_steps": 6, "batch_size": 8, "dims": [8, 16, 32], "eval_every": -1, "checkpoint_every": 0, "lr": 1e-2}
    assert cfg["method"] == "distill_nc" and cfg["loss_options"]["lambda_cls"] > 0
    spy = RecomputeDistill()
    ref = Trainer(make_config({**cfg, "run_dir": str(tmp_path / "ref")}), encoder=tiny_encoder("bert"), data=data,
                  progress=False, callbacks=[CheckpointCallback(0), spy]).fit()
    assert len(spy.gaps) == 6 and max(spy.gaps) < 1e-4, spy.gaps
    distill = ref.loss_module.distill
    init = Trainer(make_config({**cfg, "run_dir": str(tmp_path / "init")}), encoder=tiny_encoder("bert"), data=data,
                   progress=False).loss_module.distill
    for d, p, p0 in zip(distill.dims, distill.projections, init.projections):
        assert (p.weight - p0.weight).abs().max() > 1e-3   # trained, and still row-orthonormal
        torch.testing.assert_close(p.weight @ p.weight.T, torch.eye(d), rtol=0, atol=1e-5)
    names = set(read_run(tmp_path / "ref").metrics.name)
    assert {"d8/align", "d32/align", "align", "d8/cls", "d32/cls", "cls"} <= names

    assert_stopped_run_resumes_like(ref, cfg, data, lambda: tiny_encoder("bert"), str(tmp_path / "run"))


def test_distill_nc_config_errors(tmp_path):
    from matryoshka_lab.recipe import make_loss, training_data
    with pytest.raises(ValueError, match="distill_nc needs labels: a classification or hierarchy task, and 'builtin_sts' is sts"):
        training_data(make_config({"method": "distill_nc", "train_task": "builtin_sts"}))
    with pytest.raises(ValueError, match="builds its loss from the training data"):
        make_loss(make_config({"method": "distill_nc"}), 384, 6)
    import numpy as np
    data = TrainData(["a", "b"], target=(np.zeros((2, 64), np.float32), np.array([0, 1])))
    with pytest.raises(ValueError, match="dim 384 exceeds the teacher's embedding size 64"):
        make_loss(make_config({"method": "distill_nc"}), 384, 6, data)


def test_loss_lr_trains_a_losss_own_parameters_at_their_own_rate(tiny_encoder, tmp_path):
    "loss_lr is the learning rate of MIPIC's P_i / phi_i only; the encoder keeps lr; the schedule scales both alike."
    data = TrainData([f"sentence number {i} of the corpus" for i in range(40)])
    cfg = make_config({"method": "mipic", "max_steps": 3, "batch_size": 4, "dims": [8, 16, 32], "eval_every": -1,
                       "checkpoint_every": 0, "lr": 1e-4, "loss_lr": 1e-2, "run_dir": str(tmp_path / "run")})
    tr = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False)
    own = {id(p) for p in tr.loss_module.parameters()}
    by_group = {g["initial_lr"]: {id(p) in own for p in g["params"]} for g in tr.optimizer.param_groups}
    assert by_group == {1e-4: {False}, 1e-2: {True}} and len(tr.optimizer.param_groups) == 2
    tr.fit()
    ratios = {g["lr"] / g["initial_lr"] for g in tr.optimizer.param_groups}
    assert len(ratios) == 1
    with pytest.raises(ValueError, match="loss_lr must be positive, got 0"):
        make_config({"loss_lr": 0})


def test_mipic_config_trains_its_own_parameters_at_the_measured_rate():
    "configs/mipic.yaml and the experiments' 'mipic' variant share loss_lr (chosen under AnglE, nbs/studies/02_baselines)."
    import yaml
    from matryoshka_lab.studies.baselines import MIPIC_LOSS_LR, VARIANTS
    assert yaml.safe_load((ROOT / "configs" / "mipic.yaml").read_text())["loss_lr"] == MIPIC_LOSS_LR == VARIANTS["mipic"]["loss_lr"]


def test_mipic_anchor_follows_the_models_pooling():
    "MIPIC's anchor is [CLS] for a CLS-pooled model, the pooled vector otherwise, unless loss_options set it."
    from matryoshka_lab.recipe import make_loss
    cfg = make_config({"method": "mipic"})
    assert make_loss(cfg, 384, 6, pooling="mean").anchor == "pooled"
    assert make_loss(cfg, 384, 6, pooling="cls").anchor == "cls"
    assert make_loss(make_config({"method": "mipic", "loss_options": {"anchor": "cls"}}), 384, 6, pooling="mean").anchor == "cls"


class StepSpy(Callback):
    "Records the steps it saw."
    def __init__(self):
        self.steps = []
    def after_step(self, trainer):
        self.steps.append(trainer.step)


def test_a_callback_of_ones_own_is_added_to_the_defaults(tiny_encoder, tmp_path):
    "Passing a callback keeps checkpointing (the defaults stay); a default is left out only when drop names its class."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    cfg = lambda run: make_config({"run_dir": str(tmp_path / run), "max_steps": 4, "batch_size": 4, "dims": [8, 32],
                                   "checkpoint_every": 2, "keep_checkpoints": 0, "eval_every": -1})
    spy = StepSpy()
    Trainer(cfg("added"), encoder=tiny_encoder("bert"), data=data, callbacks=[spy], progress=False).fit()
    assert spy.steps == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "added" / "checkpoints").iterdir()) == ["step_0000002", "step_0000004"]
    spy = StepSpy()
    Trainer(cfg("dropped"), encoder=tiny_encoder("bert"), data=data, callbacks=[spy], drop=(CheckpointCallback,),
            progress=False).fit()
    assert spy.steps == [1, 2, 3, 4] and not (tmp_path / "dropped" / "checkpoints").exists()
    trainer = Trainer(cfg("replaced"), encoder=tiny_encoder("bert"), data=data, callbacks=[CheckpointCallback(3)],
                      progress=False)
    assert [(type(c).__name__, c.every) for c in trainer.callbacks] == [("CheckpointCallback", 3)]   # one, not two
    with pytest.raises(TypeError, match="drop takes Callback classes"):
        Trainer(cfg("bad"), encoder=tiny_encoder("bert"), data=data, drop=["CheckpointCallback"], progress=False)


def counting_tokenize(encoder):
    "Wrap encoder.tokenize to record the texts of every call."
    calls, tokenize = [], encoder.tokenize
    def counted(texts, *args, **kwargs):
        calls.append(list(texts))
        return tokenize(texts, *args, **kwargs)
    encoder.tokenize = counted
    return calls


@pytest.mark.parametrize("pairs", [False, True], ids=["simcse", "pairs"])
def test_a_step_tokenises_each_text_once_and_reads_the_device_once(pairs, tiny_encoder, tmp_path):
    "SimCSE's two views share one tokenisation; the next batch is prepared ahead; parts stay on the device until logged."
    texts = [f"sentence number {i}" for i in range(40)]
    data = TrainData(texts, [t + " again" for t in texts] if pairs else None)
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 3, "batch_size": 4, "dims": [8, 32], "eval_every": -1,
                       "objective": "infonce"})
    trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False, drop=(Callback,))
    calls = counting_tokenize(trainer.encoder)
    trainer.encoder.train()
    for step in (1, 2, 3):
        trainer.step = step
        values = trainer.train_step()
    for ahead in trainer.batches.ahead.values():   # the next batch is tokenised in the background: wait for it, or the count races
        ahead.result()
    per_batch = 2 if pairs else 1
    assert len(calls) == per_batch * 4                       # three steps and the next one ahead
    first = [texts[i] for i in trainer.batch_indices(0)]
    assert calls[0] == first and (calls[1] == [t + " again" for t in first] if pairs else True)
    assert isinstance(values["loss"], float) and isinstance(values["grad_norm"], torch.Tensor)
    assert all(isinstance(v, torch.Tensor) for k, v in values.items() if k.startswith("L"))


@pytest.mark.parametrize("pairs", [False, True], ids=["simcse", "pairs"])
def test_worker_processes_give_the_threads_batches_and_losses(pairs, tiny_encoder, tmp_path):
    "batch_workers: 2 (forked processes) trains on the same batches as the thread (0), so to the same losses; fit stops them."
    texts = [f"sentence number {i}" for i in range(40)]
    data = TrainData(texts, [t + " again" for t in texts] if pairs else None)
    losses = {}
    for workers in (0, 2):
        cfg = make_config({"run_dir": str(tmp_path / str(workers)), "max_steps": 4, "batch_size": 4, "dims": [8, 32],
                           "eval_every": -1, "objective": "infonce" if pairs else "simcse", "batch_workers": workers})
        trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False, drop=(Callback,)).fit()
        losses[workers] = read_run(tmp_path / str(workers)).metrics.query("name == 'loss'").value.tolist()
        assert trainer.batches.workers == workers and trainer.batches._pool is None      # closed by fit
    assert len(losses[0]) == 4 and losses[0] == losses[2]
    assert not multiprocessing.active_children()


def test_a_worker_process_error_reaches_the_step(tmp_path):
    "An error making a batch in a worker is raised by the call that asks for that batch; a killed worker is named."
    def make(micro):
        if micro == 1:
            raise ValueError("no texts for micro-batch 1")
        if micro == 3:
            time.sleep(30)                      # still being made when its worker is killed
        return None, {"input_ids": torch.zeros(2, 3)}, {"input_ids": torch.ones(2, 3)}
    batches = BatchesAhead(make, workers=1)
    batches(0)
    with pytest.raises(ValueError, match="no texts for micro-batch 1"):
        batches(1)
    batches(2)                                  # asks for 3
    for process in list(batches._pool._processes.values()):
        process.kill()
    with pytest.raises(RuntimeError, match="batch_workers: 0"):
        batches(3)
    assert batches._pool is None and not multiprocessing.active_children()


def test_a_worker_forked_while_a_thread_tokenises_still_tokenises(tiny_encoder):
    "The tokenizer's lock, held by another thread at the fork, is a new lock in the worker (the held copy never opens)."
    encoder = tiny_encoder("bert")
    lock = encoder_module._TOKENIZER_LOCK
    lock.acquire()                                   # as a thread mid-tokenisation would hold it
    release = threading.Timer(1.0, lock.release)
    release.start()
    batches = BatchesAhead(lambda k: (None, *[encoder.tokenize([f"text {k}", "another"], 8, device="cpu")] * 2), workers=1)
    batches(0)                                       # forks while the lock is held, then waits for it here
    made = batches.ahead[1]                          # made in the worker
    finished = concurrent.futures.wait([made], timeout=60).done
    if not finished:
        for process in list(batches._pool._processes.values()):
            process.kill()                           # or the stuck worker outlives the test
    assert finished, "the worker waits for a lock that another thread held when it forked"
    rows, a, b = made.result()
    assert a["input_ids"].shape[0] == 2 and b is a
    batches.close()
    release.join()


def running(pid: int) -> bool:
    "pid is a live process (not gone, not a zombie its new parent has yet to reap)."
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_killed_trainer_leaves_no_worker_process(tmp_path):
    "A worker ends with the process that forked it, even one killed with SIGKILL (no atexit runs)."
    script = tmp_path / "parent.py"
    script.write_text("import time, torch\n"
                      "from matryoshka_lab.batches import BatchesAhead\n"
                      "batches = BatchesAhead(lambda k: (None, *[{'input_ids': torch.zeros(2, 3)}] * 2), workers=1)\n"
                      "batches(0)\n"
                      "print(*batches._pool._processes, flush=True)\n"
                      "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert workers and all(running(pid) for pid in workers)
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.time() + 30
    while any(running(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)                 # a failing run leaves no orphan behind either
    assert not left


def test_batches_are_the_epochs_permutation_in_any_order_of_asking(tiny_encoder, tmp_path):
    "Micro-batch k is slice k mod (n // B) of epoch k // (n // B)'s permutation from seed + epoch, asked in order or not."
    data = TrainData([f"sentence number {i}" for i in range(23)])
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 3, "batch_size": 4, "dims": [8, 32], "eval_every": -1,
                       "seed": 3})
    trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False, drop=(Callback,))
    for micro in (0, 1, 7, 5, 6, 12, 2, 11, 16, 0):          # 5 per epoch: epochs 0, 1, 2, 3 and back
        epoch, pos = divmod(micro, 5)
        order = torch.randperm(23, generator=torch.Generator().manual_seed(3 + epoch)).tolist()
        assert trainer.batch_indices(micro) == order[4 * pos:4 * pos + 4]
    assert len({i for m in range(5) for i in trainer.batch_indices(m)}) == 20    # an epoch draws no row twice


def test_the_fp16_path_scales_the_loss_and_matches_float32_where_nothing_overflows(tiny_encoder, tmp_path):
    "A GPU without bf16 trains under fp16 autocast with a GradScaler: run here on the CPU's fp16 autocast."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    def run(fp16):
        cfg = make_config({"run_dir": str(tmp_path / str(fp16)), "max_steps": 3, "batch_size": 4, "dims": [8, 32],
                           "eval_every": -1, "seed": 1})
        torch.manual_seed(0)
        trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False, drop=(Callback,))
        assert trainer.precision == "fp32" and trainer.scaler is None          # the CPU trains in float32
        if fp16:
            trainer.precision, trainer.scaler = "fp16", torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        trainer.encoder.train()
        values = []
        for step in (1, 2, 3):
            trainer.step = step
            values.append(trainer.train_step())
        return [v["loss"] for v in values], [float(v["grad_norm"]) for v in values], trainer
    (ref, ref_norm, _), (got, norm, fp16) = run(False), run(True)
    assert fp16.scaler.get_scale() == 2.0 ** 8               # no step skipped: every scaled gradient was finite
    assert got != ref and got == pytest.approx(ref, rel=2e-2)   # fp16 numbers of the same three steps
    assert norm == pytest.approx(ref_norm, rel=5e-2)          # clipped and reported unscaled (x256 if not)


def test_a_compiled_model_trains_to_the_eager_losses_and_exports_the_same_keys(tiny_encoder, tmp_path):
    "compile: true (torch.compile of the model, in place) changes no number beyond float order, nor the state dict's keys."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    def run(compiled):
        cfg = make_config({"run_dir": str(tmp_path / str(compiled)), "max_steps": 2, "batch_size": 4, "dims": [8, 32],
                           "eval_every": -1, "compile": compiled})
        torch.manual_seed(0)
        encoder = tiny_encoder("bert")
        keys = list(encoder.model.state_dict())
        trainer = Trainer(cfg, encoder=encoder, data=data, progress=False).fit()
        assert (encoder.model._compiled_call_impl is not None) == compiled and list(encoder.model.state_dict()) == keys
        return read_run(cfg.run_dir).metrics.query("name == 'loss'").value.tolist(), trainer
    (ref, _), (got, compiled) = run(False), run(True)
    assert len(got) == 2 and got == pytest.approx(ref, rel=1e-5)
    exported = Encoder.from_pretrained(str(tmp_path / "True" / "model"))
    assert exported.model.state_dict().keys() == compiled.encoder.model.state_dict().keys()


def test_pin_batch_pins_the_target_rows_too(monkeypatch):
    "On a GPU a batch's target rows (scores, or a method's arrays) are pinned with its tokens: batch_target's copy does not wait for the device."
    import numpy as np
    from matryoshka_lab.batches import batch_target, pin_batch
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())   # pinning needs a GPU
    side = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    scores, arrays = np.array([0.5, 4.0]), (np.array([[1, 2], [3, 4]]), np.array([2, 0]))
    rows, a, b = pin_batch((None, side, side))
    assert rows is None and b is a and len(pinned) == 1             # SimCSE: no rows, and side_b stays side_a
    rows, _, _ = pin_batch((scores, side, side))
    assert torch.equal(rows, torch.as_tensor(scores)) and len(pinned) == 3
    rows, _, _ = pin_batch((arrays, side, side))
    assert len(pinned) == 6 and all(torch.equal(r, torch.as_tensor(x)) for r, x in zip(rows, arrays))
    assert all(torch.equal(t, torch.as_tensor(x)) for t, x in zip(batch_target(rows, "cpu"), arrays))


def test_a_repeated_positive_is_a_false_negative_the_duplicate_free_draw_never_forms(tiny_encoder, tmp_path):
    "A batch holding one positive twice scores it as a negative of its own anchor (a higher loss); the default draw never forms one."
    from matryoshka_lab.losses import cosine_matrix, info_nce
    texts = [f"question {i}" for i in range(24)]
    positives = [f"answer {i % 16}" for i in range(24)]            # rows i and i + 16 share a positive
    data = TrainData(texts, positives)
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 3, "batch_size": 6, "dims": [8, 32], "eval_every": -1,
                       "objective": "infonce"})
    enc = tiny_encoder("bert")
    plain = Trainer(dataclasses.replace(cfg, no_duplicates=False), encoder=enc, data=data, progress=False, drop=(Callback,))
    dedup = Trainer(cfg, encoder=enc, data=data, progress=False, drop=(Callback,))
    repeats = lambda idx: len(idx) - len({positives[i] for i in idx})
    plain_batches = [plain.batch_indices(k) for k in range(20)]
    assert any(repeats(idx) for idx in plain_batches)                 # the plain draw forms such batches
    assert all(repeats(dedup.batch_indices(k)) == 0 for k in range(20))
    a, b = data.texts(next(idx for idx in plain_batches if repeats(idx)))
    with torch.no_grad():                                              # (the tiny model has no dropout)
        ea, eb = (enc(**enc.tokenize(x, 16)).pooled[-1] for x in (a, b))
        logits = cosine_matrix(ea, eb) * 20
        copies = torch.tensor([[j != k and b[j] == b[k] for k in range(len(b))] for j in range(len(b))])
        intended = torch.nn.functional.cross_entropy(logits.masked_fill(copies, float("-inf")), torch.arange(len(a)))
    assert copies.any() and info_nce(ea, eb) > intended + 0.05, (info_nce(ea, eb), intended)


@pytest.mark.parametrize("method", ["base", "mrl", "2dmse", "ese", "mipic", "mic", "distill_nc"])
def test_hard_negatives_reach_every_method_that_takes_candidates(method, tiny_encoder, tmp_path):
    "Each method's loss sees the negatives as more candidates (its value moves when they do); distill_nc refuses them before step 1."
    from matryoshka_lab.methods import get_method
    n = 16
    data = TrainData([f"question {i} about {i % 4}" for i in range(n)], [f"answer {i}" for i in range(n)],
                     negatives=([f"a wrong answer {i}" for i in range(n)],))
    cfg = make_config({"run_dir": str(tmp_path), "method": method, "objective": "infonce", "batch_size": 8, "max_length": 16,
                       "dims": [8, 16, 32], "eval_every": -1, "max_steps": 1,
                       "loss_options": {"compression_size": 8} if method == "ese" else {}})
    enc = tiny_encoder("bert")
    if get_method(method).single_view:
        with pytest.raises(ValueError, match="encodes one view of each batch and takes no hard negatives"):
            Trainer(cfg, encoder=enc, data=data, progress=False, drop=(Callback,))
        return
    trainer = Trainer(cfg, encoder=enc, data=data, progress=False, drop=(Callback,))
    idx = trainer.batch_indices(0)
    a, b = data.texts(idx)
    assert b[:8] == [data.text_b[i] for i in idx] and b[8:] == [data.negatives[0][i] for i in idx]
    with torch.no_grad():
        views = method_views(trainer.method, enc, a, b, 16, blocks=data.blocks)
        fewer = method_views(trainer.method, enc, a, b[:8], 16)
        value = lambda v: trainer.loss_fn(*v, None, generator=torch.Generator().manual_seed(0)).total.item()
        with_negatives, without = value(views), value(fewer)
    assert math.isfinite(with_negatives) and abs(with_negatives - without) > 1e-4, (with_negatives, without)


def test_checkpoint_every_minus_1_writes_no_checkpoint(tiny_encoder, tmp_path):
    "checkpoint_every=-1: no checkpoint, not even at the end (each is 3x the model); the model folder is still exported. 0: one at the end only; 3: at step 3 and at the end (step 5)."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    for every, want in ((-1, None), (0, ["step_0000005"]), (3, ["step_0000003", "step_0000005"])):
        run = tmp_path / f"every{every}"
        Trainer(make_config({"run_dir": str(run), "max_steps": 5, "batch_size": 4, "dims": [8, 32], "keep_checkpoints": 0,
                             "checkpoint_every": every, "eval_every": -1}), encoder=tiny_encoder("bert"), data=data,
                progress=False).fit()
        saved = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").exists() else None
        assert saved == want, (every, saved)
        assert (run / "model" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match=r"checkpoint_every must be -1 \(no checkpoints\), 0 \(only at the end\) or more, got -2"):
        make_config({"checkpoint_every": -2})
