"""bench/gpu_step.py run as a user would (a subprocess), on the CPU at tiny sizes: every setup runs, and the last line
is the JSON the GPU run reports (also written by --out)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = ("mrl_over_bare_bf16", "st_over_mrl", "2dmse_over_mrl", "ese_over_mrl", "mipic_over_mrl", "mic_over_mrl",
         "encode_ours_over_st")


def test_gpu_step_runs_on_the_cpu(data_dir, tmp_path):
    out = tmp_path / "gpu_step.json"
    args = ["--device", "cpu", "--data-dir", str(data_dir), "--batch-size", "4", "--max-length", "16", "--rounds", "1",
            "--warmup", "1", "--encode-texts", "16", "--encode-batch-size", "8", "--encode-other-batch-sizes",
            "--out", str(out)]
    # one torch thread: on a 2-core machine shared with other test runs, 2 spinning threads per process made it 5x slower
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_step.py"), *args], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(result["goals_met"]) == set(GOALS) and all(result[k] > 0 for k in GOALS)
    setups = {f"bare_{p}" for p in ("fp32", "tf32", "bf16")} | {"st_fp32", "st_bf16"} | {
        f"{m}{s}" for m in ("base", "mrl", "2dmse", "ese", "mipic", "mic") for s in ("", "_noamp")} | {
        f"enc_{who}_{p}_b8" for who, ps in (("ours", ("fp32", "bf16", "auto", "tf32")), ("st", ("fp32", "bf16"))) for p in ps}
    assert set(result["median_ms"]) == setups
    assert result["batch_size"] == 4 and result["max_length"] == 16 and result["encode_texts"] == 16
    assert json.loads(out.read_text())["result"] == result
