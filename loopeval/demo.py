"""``loopeval demo``: the whole protocol in miniature, on a laptop, with no downloads.

1. Make a synthetic reasoning task (``loopeval.synthetic``): arithmetic word problems
   with worked, boxed solutions; train and a decontaminated test split.
2. Build a tiny Qwen3-style model and a BPE tokenizer trained on the task.
3. Train an unlooped twin and a looped model from it, identically (``loopeval.training``);
   with ``recipe="convert"``, fine-tune the base first, then convert it with LoRA.
4. Evaluate both through lm-eval's ``looped`` model at 0.5, 1, 1.5 and 2x the token
   budget, with and without budget forcing (16 real lm-eval runs, with traces).
5. Write the two-test report (``loopeval.report``) to ``OUT/report.html``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from loopeval.paths import tasks_path

TASK = "arith_boxed"
LOOP = "2:4x2"  # 6 layers -> 8 passes, c = 1.33
BUDGET = 48  # tokens at 1x; worked solutions take 20-41
SCALES = (0.5, 1.0, 1.5, 2.0)
BF_RESERVE = 12
BF_STRING = " The answer is \\boxed{"  # the solutions' own answer phrase


@dataclass(frozen=True)
class DemoSize:
    n_train: int
    n_test: int
    steps: int
    batch_size: int
    layers: int
    hidden: int
    vocab: int
    lr: float


SIZES = {
    # about 8 minutes on 2 CPU cores
    "default": DemoSize(n_train=8000, n_test=250, steps=600, batch_size=32, layers=6, hidden=128, vocab=512, lr=4e-3),
    # a smoke test of every stage, for CI (about a minute)
    "tiny": DemoSize(n_train=400, n_test=24, steps=12, batch_size=8, layers=6, hidden=32, vocab=320, lr=3e-3),
}


def _say(message: str) -> None:
    print(f"[loopeval demo] {message}", flush=True)


def _task_folder(out: Path, test_file: Path) -> Path:
    """A task that is loopeval's ``gsm8k_boxed`` (prompt, scoring) on the local test split."""
    folder = out / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "include": str(tasks_path() / "gsm8k_boxed.yaml"),
        "task": TASK,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(test_file)}, "cache_dir": str(out / "hf_cache")},
        "generation_kwargs": {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": BUDGET},
    }
    (folder / f"{TASK}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


@contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 (lm-eval's logs and progress bars, and the ``git`` it runs
    for provenance) to ``path``, so the demo shows its own progress only."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def evaluate(
    checkpoint: Path, out: Path, task_folder: Path, *, scale: float, forcing: bool, batch_size: int = 64, log: Path
) -> Path:
    """One lm-eval run of ``looped`` on the demo task, saved as the CLI saves it; lm-eval's
    own output goes to ``log``."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    model_args = {
        "pretrained": str(checkpoint),
        "device": "cpu",
        "dtype": "float32",
        "batch_size": batch_size,
        "budget_scale": scale,
        "trace": str(out),
    }
    if forcing:
        model_args.update(budget_forcing=True, bf_reserve=BF_RESERVE, bf_string=BF_STRING)
    tracker = EvaluationTracker(output_path=str(out))
    with _stderr_to(log):
        results = simple_evaluate(
            model="looped",
            model_args=model_args,
            tasks=[TASK],
            task_manager=TaskManager(include_path=str(task_folder)),
            apply_chat_template=True,
            log_samples=True,
            evaluation_tracker=tracker,
            verbosity="ERROR",
        )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    return out


def run_demo(out: str | Path = "loopeval-demo", *, size: str = "default", seed: int = 0, recipe: str = "full") -> Path:
    """Run every stage into ``out`` and return the report's path. ``recipe="convert"``
    fine-tunes the base without a loop, then trains the twin and the looped model from
    it by LoRA conversion (paper A.3) for half the steps."""
    import torch
    from tqdm.auto import tqdm

    from loopeval.checkpoint import save_model
    from loopeval.decoding import DEFAULT_ANSWER_STRING, DEFAULT_THINK_STRING
    from loopeval.report import build_report, write_report
    from loopeval.scoring import user_prompt
    from loopeval.synthetic import make_splits, write_splits
    from loopeval.tiny import tiny_model, tiny_tokenizer
    from loopeval.training import TrainConfig, train_model, train_twins

    if size not in SIZES:
        raise ValueError(f"demo size {size!r}: choose one of {', '.join(SIZES)}")
    if recipe not in ("full", "convert"):
        raise ValueError(f"demo recipe {recipe!r}: choose full or convert")
    spec = SIZES[size]
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not (out / "demo.json").is_file():
        raise ValueError(f"{out} exists and is not a loopeval demo folder; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("lm-eval", "lm_eval", "transformers", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    start = time.time()
    torch.manual_seed(seed)

    _say(f"1/5 synthetic task: {spec.n_train} training and {spec.n_test} test problems")
    train, test = make_splits(spec.n_train, spec.n_test, seed=seed)
    train_file, test_file = write_splits(out / "data", train, test)

    _say(f"2/5 tiny Qwen3 ({spec.layers} layers, hidden {spec.hidden}) and a BPE tokenizer, built locally")
    texts = [f"{user_prompt(p.question)} {p.solution}" for p in train] + [DEFAULT_THINK_STRING, DEFAULT_ANSWER_STRING]
    tokenizer = tiny_tokenizer(texts, vocab_size=spec.vocab)
    base = tiny_model("qwen3", seed=seed, vocab_size=len(tokenizer), num_layers=spec.layers, hidden=spec.hidden)
    save_model(base, tokenizer, out / "base")

    _say(f"3/5 training the twin and the looped model ({LOOP}), {spec.steps} steps each")
    config = TrainConfig(
        steps=spec.steps, batch_size=spec.batch_size, lr=spec.lr, warmup=max(1, spec.steps // 12),
        max_length=160, seed=seed, data_seed=seed, log_every=max(1, spec.steps // 20),
    )
    start_from = out / "base"
    if recipe == "convert":
        _say(f"    convert: the base is fine-tuned without a loop first, then converted with LoRA ({spec.steps // 2} steps)")
        start_from = train_model(start_from, train_file, out=out / "finetuned", config=config, overwrite=True).path
        config = TrainConfig(recipe="convert", steps=spec.steps // 2, batch_size=spec.batch_size, lr=spec.lr,
                             warmup=max(1, spec.steps // 24), max_length=160, seed=seed, data_seed=seed + 1,
                             log_every=max(1, spec.steps // 40))
    twin, looped = train_twins(start_from, train_file, loop=LOOP, out=out / "checkpoints", config=config, overwrite=True)

    task_folder = _task_folder(out, test_file)
    plan = [(m, forcing, scale) for m in ("twin", "looped") for forcing in (False, True) for scale in SCALES]
    _say(f"4/5 {len(plan)} lm-eval runs (lm-eval's log: {out / 'lm-eval.log'})")
    _say(f"    twin and looped x budgets {', '.join(f'{s:g}x' for s in SCALES)}, budget forcing off and on")
    runs = {"twin": [], "looped": []}
    log = out / "lm-eval.log"
    for model, forcing, scale in tqdm(plan, desc="lm-eval runs", unit="run", file=sys.stdout):
        name = f"{model}_{'bf' if forcing else 'plain'}_{scale:g}x"
        checkpoint = (twin if model == "twin" else looped).path
        runs[model].append(evaluate(checkpoint, out / "runs" / name, task_folder, scale=scale, forcing=forcing, log=log))

    _say("5/5 statistics and the report")
    data = build_report(runs["twin"], runs["looped"], title="loopeval demo: does the loop pay for its compute?")
    report = write_report(data, out / "report.html")
    (out / "demo.json").write_text(json.dumps({"size": size, "seed": seed, "loop": LOOP, "recipe": recipe,
                                               "seconds": time.time() - start}))
    chance = Counter(p.answer for p in test).most_common(1)[0][1] / len(test)
    for row in data.decoding:
        _say(f"  {row['setting']:14s} accuracy {100 * row['macro']:5.1f}%  cost {row['cost']:.2f}x")
    _say(f"  (always answering the most common test answer scores {100 * chance:.1f}%)")
    for cond in data.conditions:
        for sentence in cond.verdict.sentences:
            _say(f"  [{cond.label}] {sentence}")
    _say(f"done in {time.time() - start:.0f} s; open {report}")
    return report
