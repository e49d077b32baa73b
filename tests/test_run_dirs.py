"""Run directories that cannot silently lose or falsify a run: one writer, settings checked before step 1, a resume
that verifies its checkpoint, refused foreign records, output paths checked before the work, one `error:` line.

Each test holds one of the defects listed when this was built, re-run against the fix (real processes for the
two-writer and kill cases)."""
import errno
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from matryoshka_lab import cli
from matryoshka_lab.checkpoint import latest_checkpoint, resume_checkpoint
from matryoshka_lab.config import make_config
from matryoshka_lab.methods import Callback, TrainData
from matryoshka_lab.runs import RunInUse, parse_record, read_run, run_holder
from matryoshka_lab.launch import launch
from matryoshka_lab.trainer import CheckpointCallback, Trainer

MRL = ROOT / "configs" / "mrl.yaml"


def tiny_sets(model_dir, *extra):
    "A short MRL run of the tiny seeded BERT (conftest) on the generated intents, no evaluation."
    return [f"model={model_dir}", "train_task=builtin_intents", "batch_size=8", "dims=[8,16,32]", "eval_every=-1",
            "max_length=16", *extra]


def train(run_dir, *sets, config=MRL, **kw):
    cmd = ["matryoshka-lab", "train", str(config), "--no-progress", "--set", f"run_dir={run_dir}",
           *sum((["--set", s] for s in sets), [])]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def last_error(res) -> str:
    "The last stderr line of a command that must have failed with status 2."
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    return res.stderr.strip().splitlines()[-1]


def loss_lines(run_dir) -> list[int]:
    "The step of every train loss record in metrics.jsonl, repeats included (read_run would hide them)."
    recs = [parse_record(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r[0] for r in recs if r is not None and r[3] == "loss" and r[2] == "train"]


# ---- 1. one writer ----
def test_a_second_writer_is_refused_and_the_first_run_is_intact(tiny_model_dir, tmp_path):
    "While a run trains, a second `train` (other lr, or the same config), `eval RUN_DIR` and `launch` are refused."
    run_dir = tmp_path / "run"
    sets = tiny_sets(tiny_model_dir, "max_steps=100000", "checkpoint_every=50")   # runs until stopped
    first = subprocess.Popen(["matryoshka-lab", "train", str(MRL), "--no-progress", "--set", f"run_dir={run_dir}",
                              *sum((["--set", s] for s in sets), [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None and not (run_dir / "metrics.jsonl").is_file():
        time.sleep(0.1)
    assert first.poll() is None, "the first run ended before the second could start"
    assert f"process {first.pid} " in run_holder(run_dir)

    for extra in (["lr=1e-3"], []):
        message = last_error(train(run_dir, *sets, *extra))
        assert message.startswith(f"error: run directory '{run_dir}' is in use by process {first.pid} on "), message
    res = subprocess.run(["matryoshka-lab", "eval", str(run_dir), "--no-progress"], capture_output=True, text=True,
                         timeout=300)   # eval RUN_DIR writes in the run directory (eval/grid.csv) only as its one writer
    assert last_error(res).startswith(f"error: run directory '{run_dir}' is in use by process {first.pid}")
    for out, message in ((run_dir / "grid.csv", f"error: {run_dir / 'grid.csv'} is the run's own evaluation"),   # issue 59, 2:
                         (run_dir / "other.csv", f"error: run directory '{run_dir}' is in use by process {first.pid}")):
        res = subprocess.run(["matryoshka-lab", "eval", "--model", str(tiny_model_dir), "--tasks", "builtin_sts", "--out",
                              str(out), "--no-progress"], capture_output=True, text=True, timeout=300)
        assert last_error(res).startswith(message) and not out.exists()   # a file in a run directory, RUN_DIR named or not
    with pytest.raises(RunInUse, match=f"is in use by process {first.pid}"):
        launch(make_config({"run_dir": str(run_dir)}, sets))
    assert not (run_dir / "launch.yaml").exists()   # refused before writing anything

    assert first.poll() is None, "the first run ended while the others were refused"
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert json.loads((run_dir / "config.json").read_text())["lr"] == 3e-5
    steps = loss_lines(run_dir)
    assert len(steps) > 0 and steps == list(range(1, len(steps) + 1))   # each step once: nothing interleaved
    assert run_holder(run_dir) is None


def test_a_killed_writer_leaves_no_lock(tiny_model_dir, tmp_path):
    "SIGKILL releases the lock with the process: the next run resumes at once, from the checkpoint, each step once."
    run_dir = tmp_path / "run"
    sets = tiny_sets(tiny_model_dir, "max_steps=60", "checkpoint_every=5")
    proc = subprocess.Popen(["matryoshka-lab", "train", str(MRL), "--no-progress", "--set", f"run_dir={run_dir}",
                             *sum((["--set", s] for s in sets), [])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and latest_checkpoint(run_dir) is None:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert run_holder(run_dir) is None
    res = train(run_dir, *sets)
    assert res.returncode == 0, res.stderr[-3000:]
    assert loss_lines(run_dir) == list(range(1, 61))   # the dead attempt's steps after its checkpoint were dropped


# ---- 3. dims and their per-dim options ----
def test_unsorted_dims_are_refused_with_their_weights(tiny_model_dir, tmp_path):
    message = last_error(train(tmp_path / "run", *tiny_sets(tiny_model_dir, "dims=[32,8,16]", "loss_options.weights=[1,0,0]")))
    assert message == ("error: dims must be increasing, without repeats, got [32, 8, 16]: list them smallest first "
                       "(per-dim options such as loss_options.weights follow that order)")
    assert not (tmp_path / "run").exists()


# ---- 4. data rows ----
@pytest.mark.parametrize("text, message", [
    ('{"sentence1": "a", "sentence2": "b"}\n', "line 3: 'score' has no value"),
    ('{"sentence1": "a", "score": 1.0}\n', "line 3: 'sentence2' has no value"),
    ('{"sentence1": "a", "sentence2": "b", "sco', "line 3: not valid JSON"),
])
def test_a_bad_data_row_is_one_error_naming_file_and_line(text, message, tiny_model_dir, tmp_path):
    folder = tmp_path / "data" / "sts" / "stsb"
    folder.mkdir(parents=True)
    good = "".join(json.dumps({"sentence1": f"s{i}", "sentence2": f"t{i}", "score": i}) + "\n" for i in range(2))
    (folder / "test.jsonl").write_text(good + text)
    res = subprocess.run(["matryoshka-lab", "eval", "--model", str(tiny_model_dir), "--data-dir", str(tmp_path / "data"),
                          "--tasks", "stsb", "--out", str(tmp_path / "g.csv"), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert last_error(res).startswith(f"error: '{folder / 'test.jsonl'}' {message}"), res.stderr[-2000:]
    assert not (tmp_path / "g.csv").exists()


# ---- 5. evaluation settings, before step 1 ----
@pytest.mark.parametrize("sets, message", [
    (["eval_every=2", "eval_tasks=[stsbb]"], "error: unknown task 'stsbb'"),
    (["eval_every=2", "eval_tasks=[builtin_sts]", "eval_layers=99"], "error: eval_layers '99': layer 99 is out of range"),
    (["eval_every=2", "eval_tasks=[builtin_sts]", "eval_dims=16,64"], "error: eval_dims '16,64': dim 64 exceeds"),
    (["max_length=600"], "error: max_length 600 exceeds the model's 128 positions"),   # the tiny model's
])
def test_run_settings_are_checked_before_step_1(sets, message, tiny_model_dir, tmp_path):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir, "max_steps=4"), *sets)
    assert last_error(res).startswith(message), res.stderr[-2000:]
    assert not (tmp_path / "run").exists()


# ---- 6. a corrupt newest checkpoint ----
def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(tiny_model_dir, tmp_path):
    "state.pt truncated: one warning line, the step before is resumed, and every loss equals the uninterrupted run's."
    sets = tiny_sets(tiny_model_dir, "checkpoint_every=2", "schedule=constant", "warmup_ratio=0")
    ref = train(tmp_path / "ref", *sets, "max_steps=6")
    assert ref.returncode == 0, ref.stderr[-3000:]
    run_dir = tmp_path / "run"
    res = train(run_dir, *sets, "max_steps=4")
    assert res.returncode == 0, res.stderr[-3000:]
    state = run_dir / "checkpoints" / "step_0000004" / "state.pt"
    with open(state, "r+b") as f:
        f.truncate(state.stat().st_size // 2)
    res = train(run_dir, *sets, "max_steps=6")
    assert res.returncode == 0, res.stderr[-3000:]
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: checkpoint")]
    assert len(warnings) == 1 and "step_0000004 is unreadable" in warnings[0] and "moved aside to corrupt_step_0000004" in warnings[0]
    assert (run_dir / "checkpoints" / "corrupt_step_0000004").is_dir()
    a, b = (read_run(d).metrics.query("name == 'loss'").set_index("step").value for d in (tmp_path / "ref", run_dir))
    assert list(b.index) == list(range(1, 7))
    torch.testing.assert_close(torch.tensor(b.values), torch.tensor(a.values), rtol=0, atol=1e-6)


def test_a_garbled_checkpoint_fails_its_manifest(tiny_encoder, tmp_path):
    "A flipped byte in the weights (a file that still loads) is caught by the manifest's SHA-256."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    cfg = make_config({"run_dir": str(tmp_path), "max_steps": 4, "batch_size": 4, "dims": [8, 32], "eval_every": -1,
                       "checkpoint_every": 2})
    Trainer(cfg, encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    weights = tmp_path / "checkpoints" / "step_0000004" / "model" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-10] ^= 0xFF
    weights.write_bytes(bytes(raw))
    assert resume_checkpoint(tmp_path).name == "step_0000002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["corrupt_step_0000004", "step_0000002"]


# ---- 7. another run's records ----
def test_a_directory_with_another_runs_records_is_refused_without_checkpoints(tiny_encoder, tmp_path):
    data = TrainData([f"sentence number {i}" for i in range(40)])
    base = {"run_dir": str(tmp_path), "max_steps": 2, "batch_size": 4, "dims": [8, 32], "eval_every": -1}
    Trainer(make_config(base), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    shutil.rmtree(tmp_path / "checkpoints")
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="holds a run with a different config \\(lr\\)"):
        Trainer(make_config({**base, "lr": 1e-3}), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    assert (tmp_path / "metrics.jsonl").read_text() == before
    assert json.loads((tmp_path / "config.json").read_text())["lr"] == 3e-5
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="holds records \\(metrics.jsonl or checkpoints/\\) but no config.json"):
        Trainer(make_config(base), encoder=tiny_encoder("bert"), data=data, progress=False).fit()


def test_a_resume_never_trains_under_a_schedule_neither_config_has(tiny_encoder, tmp_path):
    "A new max_steps is refused where the learning-rate schedule spans it, and a checkpoint beyond max_steps always."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    base = {"run_dir": str(tmp_path), "max_steps": 4, "batch_size": 4, "dims": [8, 32], "eval_every": -1,
            "checkpoint_every": 2}
    Trainer(make_config(base), encoder=tiny_encoder("bert"), data=data, progress=False).fit()   # linear decay to 4
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="holds a run with a different config \\(max_steps\\)"):
        Trainer(make_config({**base, "max_steps": 8}), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    constant = {**base, "run_dir": str(tmp_path / "constant"), "schedule": "constant", "warmup_ratio": 0.0}
    Trainer(make_config(constant), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    with pytest.raises(ValueError, match="holds a run trained to step 4, beyond max_steps=2; use its model/ folder"):
        Trainer(make_config({**constant, "max_steps": 2}), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    assert json.loads((tmp_path / "constant" / "config.json").read_text())["max_steps"] == 4
    assert (tmp_path / "metrics.jsonl").read_text() == before
    Trainer(make_config({**constant, "max_steps": 6}), encoder=tiny_encoder("bert"), data=data, progress=False).fit()
    assert loss_lines(tmp_path / "constant") == list(range(1, 7))   # a constant rate extends the run


# ---- 8. output paths, before the work ----
@pytest.mark.parametrize("argv", [["eval", "--tasks", "builtin_sts", "--out", "{d}"],
                                  ["fractal", "--dataset", "builtin_intents", "--out", "{d}/x.json"]])
def test_an_output_folder_is_refused_before_the_work(argv, tmp_path):
    (tmp_path / "x.json").mkdir()
    res = subprocess.run(["matryoshka-lab", *[a.format(d=tmp_path) for a in argv], "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert last_error(res).endswith("is a directory: give a file name")
    assert "encode" not in res.stderr and "train" not in res.stdout   # nothing was computed first


# ---- 9. one error line, never a traceback or a silent acceptance ----
@pytest.mark.parametrize("sets, message", [
    (["max_length=-5"], "error: max_length must be at least 2 tokens (with the special tokens), got -5"),
    (["max_length=0"], "error: max_length must be at least 2 tokens"),
    (["max_steps=1.5"], "error: max_steps must be a whole number, got 1.5"),
    (["batch_size=4.5"], "error: batch_size must be a whole number, got 4.5"),
    (["lr=[1e-4"], "error: the value of override 'lr=[1e-4' is not valid YAML"),
    (["eval_every=-2"], "error: eval_every must be -1 (never), 0 (at the end) or more, got -2"),
])
def test_bad_settings_are_one_error_line_and_write_nothing(sets, message, tiny_model_dir, tmp_path):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir), *sets)
    assert last_error(res).startswith(message)
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


def test_a_malformed_yaml_file_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: mrl\ndims: [16, 32\n")
    res = subprocess.run(["matryoshka-lab", "train", str(bad)], capture_output=True, text=True, timeout=120)
    assert last_error(res).startswith(f"error: config file '{bad}' is not valid YAML: while parsing a flow sequence")


def test_max_steps_in_exponent_notation_is_a_number():
    "YAML reads 1e3 as a string; the config holds the number 1000."
    from matryoshka_lab.config import load_config
    assert load_config(MRL, ["max_steps=1e3"]).max_steps == 1000


def test_train_takes_data_dir_and_records_the_directory_used(tiny_model_dir, tmp_path, monkeypatch):
    "--data-dir like eval and demo; the directory in effect (from the option or the environment) is in config.json."
    data = tmp_path / "data"
    data.mkdir()
    for how, env, args in (("option", None, ["--data-dir", str(data)]), ("env", str(data), [])):
        monkeypatch.delenv("MATRYOSHKA_LAB_DATA", raising=False)
        if env:
            monkeypatch.setenv("MATRYOSHKA_LAB_DATA", env)
        run_dir = tmp_path / how
        rc = cli.main(["train", str(MRL), *args, "--no-progress", "--set", f"run_dir={run_dir}",
                       *sum((["--set", s] for s in tiny_sets(tiny_model_dir, "max_steps=1")), [])])
        assert rc == 0
        assert json.loads((run_dir / "config.json").read_text())["data_dir"] == str(data.resolve())


def test_a_full_disk_is_one_error_line_and_keeps_the_earlier_checkpoint(tiny_model_dir, tmp_path, monkeypatch, capsys):
    "ENOSPC while writing the second checkpoint: `error:` naming it, no half-written folder, the first one intact."
    import matryoshka_lab.trainer as trainer_module
    real_save, calls = trainer_module.torch.save, []
    def full_disk(obj, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *a, **k)
    monkeypatch.setattr(trainer_module.torch, "save", full_disk)
    run_dir = tmp_path / "run"
    rc = cli.main(["train", str(MRL), "--no-progress", "--set", f"run_dir={run_dir}",
                   *sum((["--set", s] for s in tiny_sets(tiny_model_dir, "max_steps=6", "checkpoint_every=2")), [])])
    assert rc == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: [Errno 28] writing checkpoint step 4 in") and "(No space left on device); the earlier checkpoints are untouched" in line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_0000002"]
    assert resume_checkpoint(run_dir).name == "step_0000002" and run_holder(run_dir) is None


class Poison(Callback):
    "Fault injection: at step `at`, the loss (after_loss) or a weight (after_step, before the checkpoint) becomes NaN."
    order = 7
    def __init__(self, at, weight=False):
        self.at, self.weight = at, weight
    def after_loss(self, trainer):
        if trainer.step == self.at and not self.weight:
            trainer.out.total = trainer.out.total * float("nan")
    def after_step(self, trainer):
        if trainer.step == self.at and self.weight:
            with torch.no_grad():
                next(trainer.encoder.parameters()).view(-1)[0] = float("nan")


@pytest.mark.parametrize("at, weight, aside", [(4, False, []), (5, False, ["diverged_step_0000004"]), (4, True, [])],
                         ids=["nan_loss", "nan_loss_after_a_checkpoint", "nan_weight"])
def test_after_divergence_the_last_finite_checkpoint_is_kept_and_a_lower_lr_run_starts_from_it(at, weight, aside, tiny_encoder,
                                                                                               tmp_path):
    "The checkpoint of the step before a NaN loss holds the weights that gave it: moved aside; the one before is named."
    data = TrainData([f"sentence number {i}" for i in range(40)])
    cfg = make_config({"run_dir": str(tmp_path / "run"), "max_steps": 6, "batch_size": 4, "dims": [8, 32], "eval_every": -1})
    trainer = Trainer(cfg, encoder=tiny_encoder("bert"), data=data, callbacks=[CheckpointCallback(2), Poison(at, weight)],
                      progress=False)
    kept = tmp_path / "run" / "checkpoints" / "step_0000002"
    what = f"weights are not finite after step {at} \\(" if weight else f"loss is nan at step {at} \\(non-finite parts: "
    moved = "step_0000004 holds the weights that gave it: moved aside to diverged_step_0000004. " if aside else ""
    with pytest.raises(FloatingPointError, match=f"{what}.*{moved}The last checkpoint whose weights gave finite losses, "
                                                 f"step_0000002, is kept. To go on from it .* --set model={kept}/model "
                                                 "--set run_dir=NEW_DIR"):
        trainer.fit()
    assert latest_checkpoint(tmp_path / "run") == kept
    assert sorted(p.name for p in kept.parent.iterdir()) == sorted(["step_0000002", *aside])
    assert run_holder(tmp_path / "run") is None   # the failed fit let go of the directory
    # what the message says to do works: a new run from the checkpoint's weights, at a lower lr
    new = make_config({**cfg.to_dict(), "model": str(kept / "model"), "run_dir": str(tmp_path / "new"), "lr": 1e-5})
    Trainer(new, data=data, progress=False).fit()
    assert loss_lines(tmp_path / "new") == list(range(1, 7))
