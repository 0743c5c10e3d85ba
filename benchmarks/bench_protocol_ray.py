"""What Ray adds per evaluation to ``loopeval protocol``: the same tiny study run in one
process and as Ray tasks on a local Ray of one CPU (so both run one evaluation at a time),
each run a fresh process, alternated over ``--repeats``.

The study: a tiny twin and looped Qwen3 (4 layers), a 6-item generation task of 16 tokens,
``--budgets`` budget scales each, so 2 x budgets evaluations. Each run is a fresh
process, timed from its start; an evaluation ends when its settings record is written
(just before its folder is renamed into place). Two figures per mode, medians over
``--repeats``: when the first evaluation ends (imports, ``ray.init``, the checks on every
node, the worker's start and its imports, the first evaluation) and the median time
between two consecutive ends after it (one evaluation plus, on Ray, its scheduling).
What Ray adds is the difference: a start once per run, and a cost per evaluation
(target: under 2 s).

    python benchmarks/bench_protocol_ray.py --budgets 8 --repeats 2
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402


def build(work: Path, budgets: int) -> Path:
    """The checkpoints, the task and a study file template in ``work``."""
    import yaml

    from loopeval import apply_loop, save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), tok, work / "twin")
    save_model(apply_loop(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), "1:3x2"), tok, work / "looped")
    tasks = work / "tasks"
    tasks.mkdir()
    rows = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(6)]
    (tasks / "tiny_boxed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "tiny_boxed.yaml").write_text(yaml.safe_dump({
        "task": "tiny_boxed", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(tasks / "tiny_boxed.jsonl")}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": 16, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }))
    study = {
        "name": "bench", "models": [{"name": "twin", "role": "twin", "path": str(work / "twin")},
                                    {"name": "looped", "role": "looped", "path": str(work / "looped")}],
        "tasks": ["tiny_boxed"], "include_path": [str(tasks)], "budgets": [0.25 * (i + 1) for i in range(budgets)],
        "decoding": [{"name": "plain"}], "lm_eval": {"batch_size": 6, "device": "cpu"},
        "statistics": {"n_resamples": 200, "default_scale": 0.25},
    }
    (work / "study.json").write_text(json.dumps(study))
    return work / "study.json"


def run(template: Path, out: Path, mode: str) -> None:
    """One timed run (in this process), printed as JSON."""
    import yaml

    study = {**json.loads(template.read_text()), "output": str(out)}
    if mode == "ray":
        study["ray"] = {"cpus": 1}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(study))
    init = 0.0
    if mode == "ray":
        import ray

        start = time.time()
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
        init = time.time() - start
    from loopeval.tools.study import run_study

    result = run_study(path, progress=False)
    assert set(result.outcomes.values()) == {"done"} and result.report is not None, result.outcomes
    # an evaluation's record is its last file, written just before its folder is renamed into place
    ends = sorted(f.stat().st_mtime for f in out.glob("evals/*/loopeval_evaluation.json"))
    print(json.dumps({"mode": mode, "evaluations": len(result.outcomes), "seconds": time.time() - T0,
                      "first": ends[0] - T0, "each": statistics.median(b - a for a, b in zip(ends, ends[1:])),
                      "ray_init": init}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", type=int, default=8, help="budget scales per model (2 x this many evaluations)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", help="a folder for the checkpoints and runs (default: a temporary one)")
    p.add_argument("--run", nargs=3, metavar=("STUDY", "OUT", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        return run(Path(args.run[0]), Path(args.run[1]), args.run[2])
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_protocol_ray_"))
    work.mkdir(parents=True, exist_ok=True)
    template = build(work, args.budgets)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    rows: dict[str, list[dict]] = {"single": [], "ray": []}
    for i in range(args.repeats):
        for mode in rows:
            out = subprocess.run([sys.executable, __file__, "--run", str(template), str(work / f"{mode}{i}"), mode],
                                 capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
            rows[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[mode][-1]), flush=True)
    m = {mode: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "first", "each", "ray_init")}
         for mode, rs in rows.items()}
    one, on_ray = m["single"], m["ray"]
    print(f"{2 * args.budgets} evaluations, medians of {args.repeats}: whole run {one['seconds']:.1f} s in one process, "
          f"{on_ray['seconds']:.1f} s on Ray; first evaluation done after {one['first']:.1f} s and {on_ray['first']:.1f} s "
          f"(ray.init {on_ray['ray_init']:.1f} s); each further one {one['each']:.2f} s and {on_ray['each']:.2f} s: "
          f"Ray adds {on_ray['first'] - one['first']:.1f} s once and {on_ray['each'] - one['each']:+.2f} s per evaluation")


if __name__ == "__main__":
    main()
