"""Benches run as a user would (a subprocess) at tiny sizes, and the indexes of bench/ and experiments/: bench/gpu_step.py on the CPU (every setup runs, the last
line is the JSON the GPU run reports, also written by --out), bench/funnel.py and bench/watch_overhead.py with a tiny model."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = ("mrl_over_bare_bf16", "st_over_mrl", "2dmse_over_mrl", "ese_over_mrl", "mipic_over_mrl", "mic_over_mrl",
         "encode_ours_over_st")


def run_bench(script: str, args: list, drop=(), **env) -> subprocess.CompletedProcess:
    "bench/SCRIPT as a user runs it, on one torch thread (on a 2-core machine shared with other test runs, 2 spinning threads per process made it 5x slower), the repository importable, the variables in `drop` unset."
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1", **env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)


def test_gpu_step_runs_on_the_cpu(data_dir, tmp_path):
    out = tmp_path / "gpu_step.json"
    args = ["--device", "cpu", "--data-dir", str(data_dir), "--batch-size", "4", "--max-length", "16", "--rounds", "1",
            "--warmup", "1", "--encode-texts", "16", "--encode-batch-size", "8", "--encode-other-batch-sizes",
            "--out", str(out)]
    res = run_bench("gpu_step.py", args)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(result["goals_met"]) == set(GOALS) and all(result[k] > 0 for k in GOALS)
    setups = {f"bare_{p}" for p in ("fp32", "tf32", "bf16")} | {"st_fp32", "st_bf16"} | {
        f"{m}{s}" for m in ("base", "mrl", "2dmse", "ese", "mipic", "mic") for s in ("", "_noamp")} | {
        "mrl_pretokenised", "mrl_thread", "ese_batched_eigh", "ese_given_targets"} | {
        f"enc_{who}_{p}_b8" for who, ps in (("ours", ("fp32", "bf16", "auto", "tf32")), ("st", ("fp32", "bf16"))) for p in ps}
    assert set(result["median_ms"]) == setups and result["variants"] == {}     # --variants: CUDA only
    assert result["mrl_pretokenised_over_mrl"] > 0 and result["mrl_thread_over_mrl"] > 0
    assert result["ese_batched_eigh_over_ese"] > 0 and result["ese_given_targets_over_mrl"] > 0
    assert result["batch_size"] == 4 and result["max_length"] == 16 and result["encode_texts"] == 16
    assert json.loads(out.read_text())["result"] == result
    refused = run_bench("gpu_step.py", [*args, "--variants"])
    assert refused.returncode == 2 and "--variants runs on CUDA only" in refused.stderr


def test_funnel_bench_runs_at_tiny_sizes(data_dir, tiny_model_dir, tmp_path):
    "bench/funnel.py on MRPC's paraphrase task with a tiny model: the curve, both latency tables and the last-line summary."
    out = tmp_path / "funnel.json"
    args = ["--data-dir", str(data_dir), "--model", str(tiny_model_dir), "--task", "mrpc_paraphrase", "--prefixes", "8",
            "--binary-prefixes", "16", "--shortlists", "10,50", "--grid-dims", "8,32", "--n-timed", "5", "--rounds", "1",
            "--out", str(out)]
    res = run_bench("funnel.py", args, MATRYOSHKA_LAB_CACHE=str(tmp_path / "cache"))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    record = json.loads(out.read_text())
    assert record["summary"] == summary and summary["n_queries"] == 1147
    assert len(record["curve"]) == 2 + 2 * 2 * 2                     # exact, HNSW, 2 shortlisters x 2 indexes x 2 sizes
    assert {(r["dim"], r["precision"]) for r in _rows(record["latency"]["search"])} == {
        (d, p) for d in (8, 32) for p in ("float32", "int8", "binary", "int8+rescore", "binary+rescore")}
    assert record["latency"]["encode"]["layer"] == [1, 2, 3]


def _rows(columns: dict) -> list[dict]:
    "A to_dict(orient='list') table back as rows."
    return [dict(zip(columns, vals)) for vals in zip(*columns.values())]


def test_watch_overhead_bench_runs_at_tiny_sizes(tiny_model_dir, tmp_path):
    "bench/watch_overhead.py with a tiny model, without a data directory: both setups train, the callback's diagnostics ran."
    out = tmp_path / "watch.json"
    args = ["--model", str(tiny_model_dir), "--steps", "3", "--batch-size", "4", "--max-length", "16", "--rounds", "2",
            "--out", str(out)]
    res = run_bench("watch_overhead.py", args, drop=("MATRYOSHKA_LAB_DATA",))
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    record = json.loads(out.read_text())
    assert record["overhead_ratio"] == result["overhead_ratio"] > 0 and result["goal"] == 1.05
    assert [len(record["times_s"][k]) for k in ("without", "with")] == [2, 2]
    assert result["diag_share"] > 0 and all(n >= 1 for n in result["diag_measurements"])   # at least the start's


def test_grad_cache_bench_runs_at_tiny_sizes(data_dir, tiny_model_dir, tmp_path):
    "bench/grad_cache.py with a tiny model: every setup timed and measured at each batch size, the last line the JSON --out writes."
    out = tmp_path / "grad_cache.json"
    args = ["--data-dir", str(data_dir), "--model", str(tiny_model_dir), "--batch-sizes", "4,8", "--mini-batch-size", "2",
            "--max-length", "16", "--rounds", "1", "--loss-batch-sizes", "512", "--out", str(out)]
    res = run_bench("grad_cache.py", args)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text())["result"] == result and result["batch_sizes"] == [4, 8]
    every = ("plain", "cached", "cached_tokens", "st_cached")
    for table, setups in (("seconds", every), ("peak_mib", every), ("peak_mib_full_length", every[1:]),
                          ("loss_peak_mib", ("one_pass", "by_rows"))):
        assert set(result[table]) == set(setups)
        assert all(v is not None and v >= 0 for per_size in result[table].values() for v in per_size.values())
    assert all(set(per_size) == {"4", "8"} for per_size in result["peak_mib_full_length"].values())
    assert result["loss_peak_mib"]["one_pass"]["512"] > result["loss_peak_mib"]["by_rows"]["512"]   # [512, 512] logits against [2, 512]
    assert all(r > 0 for r in result["cached_over_plain"].values())
    for b in ("4", "8"):                                # one ratio per round, their median the one reported
        ours, theirs = result["round_seconds"]["cached"][b], result["round_seconds"]["st_cached"][b]
        assert result["cached_over_st_cached_rounds"][b] == [round(x / y, 3) for x, y in zip(ours, theirs)]
        assert result["cached_over_st_cached"][b] == result["cached_over_st_cached_rounds"][b][0]   # one round


def test_bench_readme_indexes_every_script_and_its_files():
    "bench/README.md has a row for every script in bench/ (none listed that is gone), and every result file it names is committed."
    import re
    text = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    rows = [l for l in text.splitlines() if l.startswith("| `")]
    listed = [re.match(r"\| `([^`]+)`", l)[1] for l in rows]
    scripts = sorted(p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(listed) == scripts, (sorted(set(scripts) - set(listed)), sorted(set(listed) - set(scripts)))
    named = [f for l in rows for f in re.findall(r"`([\w.]+\.(?:json|txt))`", l.split("|")[3])]
    assert named and all((ROOT / "results" / "bench" / f).is_file() for f in named), \
        [f for f in named if not (ROOT / "results" / "bench" / f).is_file()]


def test_experiments_readme_indexes_every_script():
    "experiments/README.md has a row for every script in experiments/, and none for a script that is gone."
    import re
    text = (ROOT / "experiments" / "README.md").read_text(encoding="utf-8")
    listed = sorted(re.match(r"\| `([^`]+)`", l)[1] for l in text.splitlines() if l.startswith("| `"))
    assert listed == sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
