"""Training step cost, side by side: one conversion step (LoRA, teacher forward, KL)
against one full fine-tuning step of the same looped model, and the looped step against
the unlooped one (the ratio against the loop's c).

Each variant runs ``loopeval.training.train_model`` (the real step loop) in a fresh
process. The step loop's progress bar is replaced by a probe that stamps the time of
every step and samples the resident set size (RSS) while the loop runs: a step's time is
the median over the steps after the first two, and its memory is the peak RSS during
the loop above the RSS when the loop started (gradients, optimizer state, activations,
teacher logits; the weights are already loaded). Variants run interleaved,
``--repeats`` times; the table shows medians.

    python benchmarks/bench_train.py --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from train_model import add_model_args

LOOP = "2:4x2"
VARIANTS = {  # name -> (recipe, loop)
    "full, unlooped": ("full", None),
    "full, looped": ("full", LOOP),
    "convert, unlooped": ("convert", None),
    "convert, looped": ("convert", LOOP),
}


def setup(root: Path, args) -> None:
    import json as _json
    import random

    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model("qwen3", vocab_size=args.vocab, num_layers=args.layers, hidden=args.hidden)
    save_model(model, tokenizer, root / "base")
    rng = random.Random(0)
    words = ["the", "a", "loop", "model", "token", "train", "step", "pass", "layer", "cost", "twin", "data"]
    with (root / "data.jsonl").open("w") as f:
        for _ in range(64):
            f.write(_json.dumps({"text": " ".join(rng.choice(words) for _ in range(4 * args.length))}) + "\n")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _probe_class(real):
    class Probe(real):
        """Stands in for the step loop's tqdm bar (other bars stay real): one time stamp per
        step, and the peak RSS between the bar's creation (the loop starts) and its closing."""

        last = None

        def __new__(cls, *args, desc="", **kwargs):
            if desc.split(" ")[0] not in ("full", "convert", "cpt"):
                return real(*args, desc=desc, **kwargs)
            return object.__new__(cls)

        def __init__(self, *args, **kwargs):
            Probe.last = self
            self.stamps, self.start_rss, self.peak_rss, self.running = [time.perf_counter()], _rss_mib(), 0.0, True
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()

        def _sample(self):
            while self.running:
                self.peak_rss = max(self.peak_rss, _rss_mib())
                time.sleep(0.001)

        def update(self, n=1):
            self.stamps.append(time.perf_counter())

        def set_postfix(self, *args, **kwargs):
            pass

        def close(self):
            self.running = False
            self.thread.join()

        def __del__(self):
            pass

    return Probe


def child(args) -> None:
    import torch
    import tqdm.auto

    from loopeval.training import TrainConfig, train_model

    torch.set_num_threads(args.threads)
    probe = tqdm.auto.tqdm = _probe_class(tqdm.auto.tqdm)  # the step loop takes tqdm.auto's bar when it starts
    recipe, loop = VARIANTS[args.child]
    root = Path(args.root)
    config = TrainConfig(recipe=recipe, steps=args.steps, batch_size=args.batch, max_length=args.length,
                         log_every=args.steps, **({"lora_rank": 16} if recipe == "convert" else {}))
    result = train_model(root / "base", root / "data.jsonl", out=root / "out" / args.child.replace(", ", "-"),
                         loop=loop, config=config, overwrite=True, progress=False)
    probe = probe.last
    steps = [b - a for a, b in zip(probe.stamps, probe.stamps[1:])][2:]
    print(json.dumps({"step_s": statistics.median(steps), "step_mib": probe.peak_rss - probe.start_rss,
                      "multiplier": result.manifest["flops"]["multiplier"], "train_flops": result.manifest["flops"]["train"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    add_model_args(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setup(root, args)
        runs = {name: [] for name in VARIANTS}
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        for _ in range(args.repeats):
            for name in VARIANTS:
                cmd = [sys.executable, __file__, "--child", name, "--root", str(root),
                       *[f"--{k}={getattr(args, k)}" for k in ("threads", "layers", "hidden", "vocab", "batch", "length",
                                                               "steps")]]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode:
                    raise SystemExit(proc.stderr[-3000:])
                runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; batch {args.batch} x {args.length} "
          f"tokens; loop {LOOP}; {args.threads} thread(s); median of {args.repeats}\n")
    print("| variant | step time | memory of the step loop (peak RSS above its start) |\n|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['step_s']:.3f} s | {m['step_mib']:.0f} MiB |")
    c = med["full, looped"]["multiplier"]
    flops = med["full, looped"]["train_flops"] / med["full, unlooped"]["train_flops"]
    print(f"\nconvert / full step time (looped): {med['convert, looped']['step_s'] / med['full, looped']['step_s']:.2f}; "
          f"memory: {med['convert, looped']['step_mib'] / med['full, looped']['step_mib']:.2f}")
    print(f"looped / unlooped step time: full {med['full, looped']['step_s'] / med['full, unlooped']['step_s']:.3f}, "
          f"convert {med['convert, looped']['step_s'] / med['convert, unlooped']['step_s']:.3f}; "
          f"c = {c:.3f}, training FLOP ratio {flops:.3f}")


if __name__ == "__main__":
    main()
