"""Issue 59's reliability battery: each defect it found, re-run as it was found (real processes where it says so),
against the fix. Each test failed on the code before the fix."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from matryoshka_lab.runs import parse_record, read_run, run_holder
from test_run_dirs import MRL, last_error, loss_lines, tiny_sets, train


def run(*args, timeout=600, **kw):
    return subprocess.run(["matryoshka-lab", *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_6_a_task_listed_twice_is_refused_before_anything_is_written(tiny_model_dir, tmp_path):
    out = tmp_path / "g.csv"
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", "builtin_sts,builtin_sts", "--out", str(out), "--no-progress")
    assert last_error(res) == "error: task 'builtin_sts' is listed twice; a grid holds each task once"
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_10_a_device_this_machine_lacks_is_one_error_line(device, tiny_model_dir, tmp_path):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir, "max_steps=2", f"device={device}"))
    assert last_error(res).startswith(f"error: device '{device}'"), res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_16_messages_name_the_setting_the_line_and_the_file(tiny_model_dir, tmp_path):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir, "max_steps=2", "dims=[1000]", "eval_every=0",
                                             "eval_tasks=[builtin_intents]"))
    assert last_error(res).startswith("error: dims [1000]: "), res.stderr[-2000:]      # not 'eval_dims None'
    bad = tmp_path / "pairs.jsonl"
    bad.write_bytes(b'{"anchor": "a", "positive": "b"}\n{"anchor": "c", "positive": "d"}\n{"anchor": "caf\xe9", "positive": "e"}\n')
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", str(bad), "--out", str(tmp_path / "g.csv"), "--no-progress")
    assert f"'{bad}' line 3: not UTF-8 text (byte 0xe9 at column 16)" in last_error(res)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "a document"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n')
    (beir / "qrels" / "test.tsv").write_text("")
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", str(beir), "--out", str(tmp_path / "g.csv"), "--no-progress")
    assert last_error(res) == f"error: '{beir / 'qrels' / 'test.tsv'}' is empty: qrels need a header (query-id, " \
                              "corpus-id, score) and a line per judgement"
    res = run("eval", "--model", str(tiny_model_dir), "--tasks", "builtin_sts", "--precisions", "binary+rescore",
              "--out", str(tmp_path / "g.csv"), "--no-progress")
    assert res.returncode == 0 and "note: precisions binary+rescore apply to retrieval tasks, and none of these is one" \
        in res.stderr, res.stderr[-2000:]


def test_14_an_eval_task_with_nothing_to_score_is_refused_before_step_1(tiny_model_dir, tmp_path, data_dir):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir, "max_steps=2", "eval_every=0", "eval_tasks=[wiki_sents]"),
                env={**os.environ, "MATRYOSHKA_LAB_DATA": str(data_dir)})
    assert last_error(res) == "error: eval_tasks: task 'wiki_sents' of kind 'sentences' has nothing to evaluate " \
                              "(evaluation scores STS, classification, pair, hierarchy and retrieval tasks)", res.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def cli_with(patch: str, argv: list, **kw):
    "The CLI in a fresh process after `patch` (python run first: an injected failure), as `matryoshka-lab ARGV` would run."
    code = f"import sys\n{patch}\nfrom matryoshka_lab.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, **kw)


FULL_TORCH_SAVE = '''import torch
def full(*a, **k):
    raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4312")
torch.save = full'''
FULL_SAFETENSORS = '''import transformers.modeling_utils as mu
from safetensors import SafetensorError
fits = mu.safe_save_file
def full(tensors, filename, *a, **k):
    if "checkpoints" in str(filename):                   # the disk fills after the last checkpoint, at the export
        return fits(tensors, filename, *a, **k)
    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
mu.safe_save_file = full'''


def test_8_a_full_disk_is_one_error_line_and_leaves_no_half_written_folder(tiny_model_dir, tmp_path):
    "torch.save and safetensors report a full disk as RuntimeError and SafetensorError (a 4 MB tmpfs), injected here."
    argv = ["train", str(MRL), "--no-progress", "--set", f"run_dir={tmp_path / 'a'}",
            *sum((["--set", s] for s in tiny_sets(tiny_model_dir, "max_steps=2", "checkpoint_every=1")), [])]
    res = cli_with(FULL_TORCH_SAVE, argv)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == f"error: [Errno 5] writing checkpoint step 1 in '{tmp_path / 'a' / 'checkpoints'}' " \
        "failed (RuntimeError: [enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4312; a full disk?); " \
        "the earlier checkpoints are untouched"
    assert list((tmp_path / "a" / "checkpoints").iterdir()) == []                    # no .tmp_step_* left behind
    argv = [a.replace(str(tmp_path / "a"), str(tmp_path / "b")) for a in argv[:-2]] + ["--set", "checkpoint_every=0"]
    res = cli_with(FULL_SAFETENSORS, argv)                                          # the export at the end
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: [Errno 5] writing the model folder '{tmp_path / 'b' / 'model'}' "
                                                          "failed (SafetensorError: Error while serializing")
    assert sorted(p.name for p in (tmp_path / "b").iterdir() if p.name.startswith(("model", ".model"))) == []


def test_11_a_damaged_model_folder_is_one_error_line(tiny_model_dir, tmp_path):
    res = train(tmp_path / "run", *tiny_sets(tiny_model_dir, "max_steps=2", "eval_tasks=[builtin_sts]"))
    assert res.returncode == 0, res.stderr[-3000:]
    weights = tmp_path / "run" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])                                # a kill mid-write, as it was
    res = run("eval", str(tmp_path / "run"), "--no-progress")
    assert last_error(res).startswith(f"error: the model folder '{tmp_path / 'run' / 'model'}' is damaged: its weights "
                                      "do not read (Error while deserializing header"), res.stderr[-2000:]


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json"])
def test_7_a_fifo_among_a_runs_records_is_refused_not_waited_on(name, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    res = train(run_dir, *tiny_sets(tiny_model_dir, "max_steps=2", "eval_tasks=[builtin_sts]"))
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    message = f"error: '{run_dir / name}' is a FIFO: a run directory's records must be regular files; "
    res = train(run_dir, *tiny_sets(tiny_model_dir, "max_steps=4", "eval_tasks=[builtin_sts]"))   # a resume
    assert last_error(res).startswith(message), res.stderr[-2000:]
    res = run("eval", str(run_dir), "--no-progress", timeout=120)
    assert last_error(res).startswith(message), res.stderr[-2000:]


@pytest.mark.parametrize("kept", [0, 3])
def test_4_a_run_killed_during_an_evaluation_makes_it_when_resumed(kept, tiny_model_dir, tmp_path):
    "Killed once checkpoint 4 is written, while step 4 is evaluated (its eval records, if the kill came late, cut to"
    "`kept` of them, as a kill between two records once left them): the resumed run evaluates step 4 whole before step 5."
    run_dir = tmp_path / "run"
    sets = tiny_sets(tiny_model_dir, "max_steps=8", "checkpoint_every=4", "eval_every=2", "eval_tasks=[builtin_sts]")
    cmd = ["matryoshka-lab", "train", str(MRL), "--no-progress", "--set", f"run_dir={run_dir}", *sum((["--set", s] for s in sets), [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (run_dir / "checkpoints" / "step_0000004").is_dir():
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert (run_dir / "checkpoints" / "step_0000004").is_dir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    at = lambda l, split, step: (parse_record(l) or (0, 0, ""))[2] == split and parse_record(l)[0] == step
    step2 = [l for l in lines if at(l, "eval", 2)]
    assert len(step2) > kept
    (run_dir / "metrics.jsonl").write_text("".join(l for l in lines if not at(l, "eval", 4))
                                           + "".join(l.replace('"step": 2,', '"step": 4,') for l in step2[:kept]))
    res = train(run_dir, *sets)
    assert res.returncode == 0, res.stderr[-3000:]
    evals = read_run(run_dir).metrics.query("split == 'eval'")
    test_cells = evals.groupby("step").name.nunique()
    assert list(test_cells.index) == [2, 4, 6, 8] and len(set(test_cells)) == 1, test_cells


def test_1_two_launches_of_one_new_run_directory_at_once_start_one_run(tiny_model_dir, tmp_path):
    "The second is refused (RunInUse) and touches nothing; the one started trains its own config to the end."
    from concurrent.futures import ThreadPoolExecutor
    from matryoshka_lab.config import make_config
    from matryoshka_lab.launch import launch
    from matryoshka_lab.runs import RunInUse
    run_dir = tmp_path / "run"
    cfgs = [make_config({"run_dir": str(run_dir)}, tiny_sets(tiny_model_dir, "max_steps=4", f"lr={lr}")) for lr in (3e-5, 1e-3)]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(launch, cfg) for cfg in cfgs]
    outcomes = [f.exception() or f.result() for f in futures]
    refused = [o for o in outcomes if isinstance(o, RunInUse)]
    started = [(o, cfg) for o, cfg in zip(outcomes, cfgs) if not isinstance(o, BaseException)]
    assert len(refused) == 1 and len(started) == 1, outcomes
    job, cfg = started[0]
    job.wait(300)
    assert read_run(run_dir).config["lr"] == cfg.lr
    assert sorted(read_run(run_dir).metrics.query("name == 'loss'").step) == [1, 2, 3, 4]


def loss_steps(run_dir) -> int:
    return len(loss_lines(run_dir)) if (run_dir / "metrics.jsonl").is_file() else 0


def test_9_an_error_in_a_two_process_job_is_one_error_line(tiny_model_dir, tmp_path):
    sets = tiny_sets(tiny_model_dir, "max_steps=2", "dims=[1000]", "eval_every=0", "eval_tasks=[builtin_intents]")
    res = run("train", str(MRL), "--nproc", "2", "--no-progress", "--set", f"run_dir={tmp_path / 'run'}",
              *sum((["--set", s] for s in sets), []))
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert errors == ["error: dims [1000]: dim 1000 exceeds the model's hidden size 32"], res.stderr[-3000:]
    assert last_error(res) == errors[0] and "Traceback" not in res.stderr and "ChildFailedError" not in res.stderr


def test_12_sigterm_to_a_two_process_train_stops_its_workers_and_frees_the_run(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    sets = tiny_sets(tiny_model_dir, "max_steps=100000", "log_every=1")
    proc = subprocess.Popen(["matryoshka-lab", "train", str(MRL), "--nproc", "2", "--no-progress", "--set", f"run_dir={run_dir}",
                             *sum((["--set", s] for s in sets), [])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not loss_steps(run_dir):
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM
    before = loss_steps(run_dir)
    time.sleep(3)
    assert loss_steps(run_dir) == before and run_holder(run_dir) is None      # nobody trains on, nobody holds it


def test_13_a_malformed_grid_or_a_huge_layer_number_blanks_no_page(tmp_path):
    "A grid.csv with a cell twice or a numeric metric column, and a record named with a 20-digit layer: every page draws."
    import json
    from matryoshka_lab.grid_tabs import read_grid
    from matryoshka_lab.workbench import build_app
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.json").write_text('{"method": "mrl"}')
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, "time": s, "split": "train", "name": "loss", "value": 1 / s}) + "\n")
            f.write(json.dumps({"step": s, "time": s, "split": "eval", "name": "stsb/L6/d16/spearman", "value": 50 + s}) + "\n")
        f.write(json.dumps({"step": 3, "time": 3, "split": "eval", "name": "stsb/L99999999999999999999/d16/spearman",
                            "value": 1}) + "\n")
    (tmp_path / "bad").mkdir()
    for rows, want in (("stsb,6,16,spearman,1\nstsb,6,16,spearman,2\n", [("stsb", 6, 16, "spearman", 2.0)]),
                       ("stsb,6,16,1,1\nstsb,6,32,2,2\n", [("stsb", 6, 16, "1", 1.0), ("stsb", 6, 32, "2", 2.0)])):
        (tmp_path / "bad" / "grid.csv").write_text("task,layer,dim,metric,value\n" + rows)
        grid = read_grid(tmp_path / "bad" / "grid.csv", tmp_path)
        assert list(grid.itertuples(index=False, name=None)) == want
        wb = build_app(tmp_path, "r1")                                               # raised before
        assert wb.tail is not None and "bad/grid.csv" in wb.grid_views[0].picker.grids


def test_a_resume_after_config_json_was_edited_with_the_command_is_refused(tiny_model_dir, tmp_path):
    "config.json edited by hand and the command changed to match: the checkpoint's own config (saved with it) refuses the resume, where the checkpoint's optimizer would have kept the old learning rate under the new config's name."
    import json
    run_dir = tmp_path / "run"
    sets = tiny_sets(tiny_model_dir, "schedule=constant", "warmup_ratio=0", "checkpoint_every=2")
    res = train(run_dir, *sets, "max_steps=4")
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**saved, "lr": 1e-3, "batch_size": 16}))
    res = train(run_dir, *sets, "max_steps=6", "lr=1e-3", "batch_size=16")
    assert last_error(res) == (f"error: run directory '{run_dir}': its checkpoint step_0000004 was trained with another "
                               "config (batch_size, lr); restore its config.json, or use another run_dir")
    assert sorted(read_run(run_dir).metrics.query("name == 'loss'").step) == [1, 2, 3, 4]   # nothing trained on
