"""The demo's training phase alone and next to a competing CPU-bound job, three thread
policies side by side in one run.

Each measurement is a fresh process that builds the demo's task, tokenizer and tiny
Qwen3 exactly as ``loopeval demo`` does (``--size``), then times ``train_twins`` (the
twin and the looped model, ``--steps`` steps each; the demo trains
``SIZES[size].steps``). The environment is a new user's: no ``OMP_NUM_THREADS``. Policies:

* ``old``: torch's default (one thread per core), the two sides one after the other, what
  loopeval did before issue 26 (the worker gets ``LOOPEVAL_THREADS`` = the core count);
* ``policy``: ``loopeval.common.threads`` as ``loopeval train`` uses it, the sides one
  after the other (since issue 31 one thread per core whatever the load, as ``old``; before,
  the cores free then, re-measured every 2 s);
* ``demo``: what ``loopeval demo`` does now: both sides at once, two processes of one
  thread each (``train_twins(parallel=True, threads=1)``).

The competitor is one process running float32 matrix products with torch's default
threads (every core), started before and stopped after each "loaded" measurement.
Order is interleaved over ``--repeats``; the table shows the median seconds, and the ratio
loaded / alone per policy (target: at most 2.5, and alone no slower than ``old``).

    python benchmarks/bench_threads.py --steps 20 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ("old", "policy", "demo")
COMPETITOR = """
import torch
a = torch.randn(1024, 1024)
while True:
    a = torch.tanh(a @ a)
"""


def worker(size: str, steps: int, policy: str, root: Path) -> dict:
    """Build the demo's inputs into ``root`` (once) and time ``steps`` training steps of both sides."""
    from loopeval.common.threads import configure_threads
    from loopeval.evaluation.decoding import DEFAULT_ANSWER_STRING, DEFAULT_THINK_STRING
    from loopeval.evaluation.scoring import user_prompt
    from loopeval.tools.demo import LOOP, SIZES, TRAIN_THREADS

    spec = SIZES[size]
    import torch

    from loopeval.core.checkpoint import save_model
    from loopeval.tools.synthetic import make_splits, write_splits
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer
    from loopeval.training import TrainConfig, train_twins

    if not (root / "base").exists():
        train, test = make_splits(spec.n_train, spec.n_test, seed=0)
        write_splits(root / "data", train, test)
        texts = [f"{user_prompt(p.question)} {p.solution}" for p in train] + [DEFAULT_THINK_STRING, DEFAULT_ANSWER_STRING]
        tokenizer = tiny_tokenizer(texts, vocab_size=spec.vocab)
        base = tiny_model("qwen3", seed=0, vocab_size=len(tokenizer), num_layers=spec.layers, hidden=spec.hidden)
        save_model(base, tokenizer, root / "base")
    config = TrainConfig(steps=steps, batch_size=spec.batch_size, lr=spec.lr, warmup=max(1, steps // 12),
                         max_length=160, seed=0, data_seed=0, log_every=steps)
    options = dict(parallel=True, threads=TRAIN_THREADS) if policy == "demo" else {}
    choice = configure_threads().to_dict() if policy != "demo" else {"threads": TRAIN_THREADS, "source": "demo"}
    start = time.perf_counter()
    train_twins(root / "base", root / "data" / "train.jsonl", loop=LOOP, out=root / f"out-{policy}", config=config,
                overwrite=True, progress=False, **options)
    return {"seconds": time.perf_counter() - start, "threads": choice["threads"] if policy == "demo" else
            torch.get_num_threads(), "choice": choice}


def _env(policy: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOOPEVAL_THREADS")}
    if policy == "old":
        env["LOOPEVAL_THREADS"] = str(os.cpu_count() or 1)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure(args, policy: str, loaded: bool, root: Path) -> dict:
    competitor = None
    if loaded:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=_env())
        time.sleep(2.0)
    try:
        out = subprocess.run([sys.executable, __file__, "--worker", policy, "--size", args.size, "--steps",
                              str(args.steps), "--root", str(root)], env=_env(policy), capture_output=True, text=True, check=False)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="default", help="the demo size whose training phase runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", choices=POLICIES, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.size, args.steps, args.worker, Path(args.root))))
        return
    cases = [(p, loaded) for loaded in (False, True) for p in POLICIES]
    times = {c: [] for c in cases}
    threads = {}
    with tempfile.TemporaryDirectory(prefix="bench_threads_") as tmp:
        root = Path(tmp)
        measure(args, "old", False, root)  # builds the inputs once (not timed)
        for i in range(args.repeats):
            for case in (cases if i % 2 == 0 else cases[::-1]):
                result = measure(args, *case, root)
                times[case].append(result["seconds"])
                threads[case] = result["threads"]
                print(f"  {case[0]:>3} {'loaded' if case[1] else 'alone':>6}: {result['seconds']:.1f} s, "
                      f"{result['threads']} thread(s)", file=sys.stderr, flush=True)
    try:
        load = os.getloadavg()
    except OSError:
        load = ()
    print(f"demo size {args.size}: {args.steps} training steps of the twin and of the looped model, median of "
          f"{args.repeats}; {os.cpu_count()} cores; load average at the end {', '.join(f'{x:.2f}' for x in load)}")
    print(f"{'policy':<8}{'threads alone/loaded':>22}{'alone s':>10}{'loaded s':>10}{'loaded/alone':>14}{'alone/old alone':>17}")
    old = statistics.median(times[("old", False)])
    for policy in POLICIES:
        alone = statistics.median(times[(policy, False)])
        loaded = statistics.median(times[(policy, True)])
        used = f"{threads[(policy, False)]}/{threads[(policy, True)]}"
        print(f"{policy:<8}{used:>22}{alone:>10.1f}{loaded:>10.1f}{loaded / alone:>14.2f}{alone / old:>17.2f}")


if __name__ == "__main__":
    main()
