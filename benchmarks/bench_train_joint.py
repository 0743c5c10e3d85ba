"""The joint two-path step (companion paper 002) against a looped-only step, side by side.

Every variant trains the same base by ``loopeval.training.train_model`` (the real step
loop) and is read back from its manifest: forward blocks per step (``blocks.per_step``)
and seconds per step (``step_seconds``, the median over the steps after the first two).
Variants run interleaved, ``--repeats`` times, in one process; the table shows medians.
The shared prefix should make a joint step cost less than a single-pass step plus a
looped-only step.

    python benchmarks/bench_train_joint.py --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

LOOP = "2:6x2"  # 002's shape: 8 layers, layers 2-5 run twice
VARIANTS = {  # name -> (loop, TrainConfig options)
    "single pass (the twin)": (None, {}),
    "looped only": (LOOP, {"stages": "loop:{steps}"}),
    "joint CE": (LOOP, {}),
    "joint + online KD": (LOOP, {"teacher": "online", "receiver": "single"}),
    "joint + frozen-original KD": (LOOP, {"teacher": "frozen-original", "receiver": "single"}),
}


def setup(root: Path, args) -> None:
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    save_model(tiny_model("qwen3", vocab_size=args.vocab, num_layers=8, hidden=args.hidden), tiny_tokenizer(),
               root / "base")
    rng = random.Random(0)
    words = ["the", "a", "loop", "model", "token", "train", "step", "pass", "layer", "cost", "twin", "data"]
    with (root / "data.jsonl").open("w") as f:
        for _ in range(64):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(4 * args.length))}) + "\n")


def run(root: Path, name: str, args) -> tuple[float, float]:
    from loopeval.training import TrainConfig, train_model

    loop, options = VARIANTS[name]
    options = {k: v.format(steps=args.steps) if isinstance(v, str) else v for k, v in options.items()}
    config = TrainConfig(recipe="joint", steps=args.steps, batch_size=4, max_length=args.length, lr=1e-4, **options)
    m = train_model(root / "base", root / "data.jsonl", out=root / "out", loop=loop, config=config, overwrite=True,
                    progress=False).manifest
    return m["blocks"]["per_step"][0], statistics.median(m["step_seconds"][2:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setup(root, args)
        seconds, blocks = {n: [] for n in VARIANTS}, {}
        for _ in range(args.repeats):
            for name in VARIANTS:
                blocks[name], s = run(root, name, args)
                seconds[name].append(s)
    median = {n: statistics.median(v) for n, v in seconds.items()}
    print(f"qwen3, 8 layers, hidden {args.hidden}, vocabulary {args.vocab}, loop {LOOP}, batch 4 x {args.length} tokens, "
          f"{args.threads} thread(s), median of {args.repeats} repeats")
    print(f"{'variant':<30} {'blocks/step':>11} {'s/step':>8}")
    for name in VARIANTS:
        print(f"{name:<30} {blocks[name]:>11g} {median[name]:>8.3f}")
    apart = median["single pass (the twin)"] + median["looped only"]
    print(f"joint CE / (single pass + looped only): blocks {blocks['joint CE']:g} / "
          f"{blocks['single pass (the twin)'] + blocks['looped only']:g}, seconds {median['joint CE'] / apart:.3f}")


if __name__ == "__main__":
    main()
