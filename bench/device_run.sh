#!/usr/bin/env bash
# The GPU benches in one call of a lent machine (590 s at most), each under its own time limit, their
# outputs and result files written to OUT. Here: `python bench/device_payload.py .gpu` (the model in fp16, the data
# files); then, on the machine, from the repository, with .gpu carried along:
#     bash bench/device_run.sh .gpu "$OUT"
# Each bench prints its own lines to OUT/NAME.txt (errors to OUT/NAME.err); this script prints one line per bench.
set -u
payload=${1:?usage: bash bench/device_run.sh PAYLOAD OUT}
out=${2:?usage: bash bench/device_run.sh PAYLOAD OUT}
mkdir -p "$out"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" MATRYOSHKA_LAB_DATA="$payload/data"
run() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 "$@" > "$out/$name.txt" 2> "$out/$name.err"
    echo "$name: exit $?, $(tail -n 1 "$out/$name.txt" | cut -c1-160)"
}
run step_ops 50 bench/step_ops.py --model "$payload/model" --device cuda --out "$out/step_ops.json"
run loss_forms 30 bench/loss_forms.py --device cuda --out "$out/loss_forms.json"
run ese_projection 50 bench/ese_projection.py --model "$payload/model" --device cuda --rounds 10 --out "$out/ese_projection.json"
run gpu_profile 140 bench/gpu_profile.py --model "$payload/model"
run gpu_step 320 bench/gpu_step.py --model "$payload/model" --device cuda --out "$out/gpu_step.json"
