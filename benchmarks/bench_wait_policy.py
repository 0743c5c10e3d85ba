"""Idle OpenMP threads sleeping (loopeval's ``OMP_WAIT_POLICY=PASSIVE``) against spinning,
alone and next to a competing all-core torch job, for ``loopeval train``, ``loopeval
place``, ``lm_eval --model looped`` and ``loopeval demo --size tiny``, side by side in one run.

Each measurement is the real command in a fresh process, on a tiny Qwen3 built once
(``--layers``, ``--hidden``). The thread count is loopeval's default (one per core) in
every case; only the wait policy differs:

* ``passive``: the command as shipped (loopeval sets ``OMP_WAIT_POLICY=PASSIVE`` before
  torch starts its OpenMP runtime);
* ``spin``: the same command with torch imported first, so its runtime starts with
  GNU OpenMP's default (idle threads spin about 3 ms before they sleep): what loopeval
  did before issue 38.

The competitor is one process of float32 matrix products at torch's default threads
(every core) and default wait policy, started (and seen running) before, and stopped
after, each "loaded" measurement. Cases are interleaved over ``--repeats``; the table
shows median seconds, loaded / alone per policy (issue 38's target: at most 2.5), and
whether every case's outputs (trained weights, placement scores, lm-eval responses and
log-likelihoods) are bit-equal to the first idle run's.

    python benchmarks/bench_wait_policy.py --steps 40 --repeats 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMPETITOR = """
import torch
a = torch.randn(1024, 1024)
print("running", flush=True)
while True:
    a = torch.tanh(a @ a)
"""
POLICIES = ("spin", "passive")
WORKLOADS = ("train", "place", "lm_eval", "demo")
TASK = """\
task: bench_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs: {{until: ["\\n\\n"], do_sample: false, max_gen_toks: 48}}
metric_list: [{{metric: exact_match}}]
"""


def build(root: Path, layers: int, hidden: int) -> None:
    """A tiny base checkpoint, training text and a generation task, once."""
    from loopeval.core.checkpoint import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    texts = [" ".join(f"{a} plus {b} is {a + b}." for b in range(i, i + 12)) for a in range(40) for i in (0, 5)]
    (root / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = tiny_tokenizer(texts, vocab_size=512)
    save_model(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=layers, hidden=hidden), tokenizer, root / "base")
    rows = [{"question": f"What is {a} plus {a + 3}?", "answer": str(2 * a + 3)} for a in range(16)]
    (root / "task").mkdir()
    (root / "task" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "task" / "bench_gen.yaml").write_text(TASK.format(data=root / "task" / "rows.jsonl"))


def command(workload: str, root: Path, out: Path, steps: int) -> tuple[list[str], str]:
    """The workload's command line (after ``python -c PRELUDE``) and the entry point's call."""
    if workload == "train":
        return (["train", "--base", str(root / "base"), "--data", str(root / "data.jsonl"), "--loop", "1:3x2",
                 "--out", str(out), "--steps", str(steps), "--batch-size", "8", "--max-length", "96"],
                "from loopeval.cli import main; raise SystemExit(main(sys.argv[1:]))")
    if workload == "demo":  # the demo at its smoke-test size: every stage, one thread per process by design
        return (["demo", "--size", "tiny", "--out", str(out)],
                "from loopeval.cli import main; raise SystemExit(main(sys.argv[1:]))")
    if workload == "place":
        return (["place", "--model", str(root / "base"), "--data", str(root / "data.jsonl"), "--out", str(out),
                 "--widths", "2", "--times", "2", "--betas", "0", "--seq-len", "128", "--max-tokens", "4096",
                 "--device", "cpu"],
                "from loopeval.cli import main; raise SystemExit(main(sys.argv[1:]))")
    return (["--model", "looped", "--model_args", f"pretrained={root / 'base'},loop=1:3x2", "--device", "cpu",
             "--tasks", "bench_gen", "--include_path", str(root / "task"), "--batch_size", "8", "--log_samples",
             "--output_path", str(out)],
            "from lm_eval.__main__ import cli_evaluate; sys.argv = ['lm_eval'] + sys.argv[1:]; cli_evaluate()")


def outputs(workload: str, out: Path) -> str:
    """A digest of what the command computed (not of timestamps or paths)."""
    h = hashlib.sha256()
    if workload == "train":
        for side in ("twin", "looped"):
            h.update((out / side / "model.safetensors").read_bytes())
    elif workload == "place":
        h.update((out / "placements.jsonl").read_bytes())
    else:  # lm_eval's output folder, or the demo's evaluations
        for samples in sorted(out.rglob("samples_*.jsonl"), key=lambda p: (p.parent.name, p.name.split("_20")[0])):
            for line in samples.read_text().splitlines():
                record = json.loads(line)
                h.update(json.dumps([record["doc_id"], record["resps"]]).encode())
    return h.hexdigest()[:16]


def _env() -> dict:
    drop = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOOPEVAL_THREADS", "OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure(workload: str, policy: str, loaded: bool, root: Path, steps: int, n: int) -> tuple[float, str]:
    out = root / f"out-{workload}-{policy}-{'loaded' if loaded else 'alone'}-{n}"
    argv, entry = command(workload, root, out, steps)
    prelude = ("import torch\n" if policy == "spin" else "") + "import sys\n" + entry
    competitor = None
    if loaded:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=_env(), stdout=subprocess.PIPE, text=True)
        assert competitor.stdout.readline().strip() == "running"
    try:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", prelude, *argv], env=_env(), capture_output=True, text=True)
        seconds = time.perf_counter() - start
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    if done.returncode != 0:
        raise RuntimeError(f"{workload} {policy}: {done.stderr[-3000:]}")
    return seconds, outputs(workload, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="training steps of each side")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    cases = [(w, p, loaded) for w in workloads for loaded in (False, True) for p in POLICIES]
    times = {c: [] for c in cases}
    digests = {c: set() for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench_wait_") as tmp:
        root = Path(tmp)
        build(root, args.layers, args.hidden)
        for i in range(args.repeats):
            for case in (cases if i % 2 == 0 else cases[::-1]):
                seconds, digest = measure(*case, root, args.steps, i)
                times[case].append(seconds)
                digests[case].add(digest)
                print(f"  {case[0]:>8} {case[1]:>8} {'loaded' if case[2] else 'alone':>6}: {seconds:6.1f} s  {digest}",
                      file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} cores, one torch thread per core, median of {args.repeats}; tiny Qwen3 "
          f"{args.layers} layers, hidden {args.hidden}; train: {args.steps} steps of each side")
    print(f"{'workload':<10}{'policy':<9}{'alone s':>9}{'loaded s':>10}{'loaded/alone':>14}  outputs equal to idle spin")
    for w in workloads:
        reference = digests[(w, "spin", False)]
        for p in POLICIES:
            alone, loaded = statistics.median(times[(w, p, False)]), statistics.median(times[(w, p, True)])
            same = digests[(w, p, False)] == digests[(w, p, True)] == reference and len(reference) == 1
            print(f"{w:<10}{p:<9}{alone:>9.1f}{loaded:>10.1f}{loaded / alone:>14.2f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
