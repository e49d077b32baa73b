"""RunDirectoryCallback in a process that dies: the run directory stays readable, and the trainer's resume from its
checkpoint continues the same directory without the dead attempt's records (nbs/27_watch.ipynb has the rest)."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT
from matryoshka_lab.runs import read_run

WRITER = """
import sys, time, warnings
warnings.filterwarnings("ignore")
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss
from transformers import TrainerCallback
from matryoshka_lab.watch import RunDirectoryCallback
model_dir, run_dir, out_dir, resume = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "resume"

class Slow(TrainerCallback):   # time for the test to kill it mid-run
    def on_step_end(self, *args, **kwargs):
        time.sleep(0.3)

model = SentenceTransformer(model_dir, device="cpu")
pairs = Dataset.from_dict({"anchor": [f"sentence number {i} about topic {i % 5}" for i in range(64)],
                           "positive": [f"the {i}th sentence, on topic {i % 5}" for i in range(64)]})
args = SentenceTransformerTrainingArguments(output_dir=out_dir, max_steps=12, per_device_train_batch_size=8, logging_steps=1,
                                            eval_strategy="steps", eval_steps=4, save_steps=4, report_to=[], use_cpu=True,
                                            disable_tqdm=True, seed=0)
trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, eval_dataset=pairs.select(range(8)),
                                     loss=MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), [32, 16, 8]),
                                     callbacks=[RunDirectoryCallback(run_dir, tasks=["builtin_sts"], dims=[8, 16, 32],
                                                                     diagnostics_budget=1e6), Slow()])
trainer.train(resume_from_checkpoint=resume)
"""


def raw_records(run_dir) -> list[tuple]:
    "(step, split, name) of every complete line of metrics.jsonl, repeats included."
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        out.append((r["step"], r["split"], r["name"]))
    return out


def test_killed_run_stays_readable_and_resumes_in_the_same_directory(tmp_path, tiny_model_dir):
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = lambda how: [sys.executable, "-c", WRITER, str(tiny_model_dir), str(run_dir), str(out_dir), how]
    proc = subprocess.Popen(cmd("fresh"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        m = read_run(run_dir).metrics if (run_dir / "metrics.jsonl").is_file() else None
        if m is not None and ((m.split == "train") & (m.name == "loss")).sum() >= 6:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "time": 1.0, "split": "tr')       # what a kill in the middle of a write leaves
    (run_dir / "arrays" / "diag_erank").mkdir(parents=True, exist_ok=True)
    (run_dir / "arrays" / "diag_erank" / ".step_0000009.npy.tmp").write_bytes(b"\x93NUMPY")   # a snapshot never renamed

    dead = read_run(run_dir)                                   # the workbench's reader: no error, the complete records
    died_at = int(dead.metrics[dead.metrics.name == "loss"].step.max())
    assert died_at >= 6 and "grid.csv" in os.listdir(run_dir)
    # a step's diagnostics are written at its end, before the trainer logs its loss: a kill between leaves one step more
    assert all(s <= died_at + 1 for s, _ in dead.arrays["diag_erank"])
    saved = max(int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*"))
    assert saved in (4, 8) and saved <= died_at

    before = (run_dir / "metrics.jsonl").read_bytes()               # started again from step 0 (issue 59, 3): refused,
    res = subprocess.run(cmd("fresh"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0 and f"holds a run trained to step {died_at}" in res.stderr, res.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").read_bytes() == before                 # its records untouched

    res = subprocess.run(cmd("resume"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = raw_records(run_dir)
    assert len(records) == len(set(records)), "a record of the dead attempt survived the resume"
    losses = sorted(s for s, split, name in records if (split, name) == ("train", "loss"))
    assert losses == list(range(1, 13))
    grids = sorted({s for s, split, name in records if name == "builtin_sts/L3/d8/spearman"})
    assert grids == [0, 4, 8, 12]
    assert read_run(run_dir).config["max_steps"] == 12
