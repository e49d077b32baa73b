"""Issue 59's reliability battery: each defect it found, re-run as it was found (real processes where it says so),
against the fix. Each test failed on the code before the fix."""
import subprocess

import pytest
import torch

from test_run_dirs import last_error, tiny_sets, train


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
