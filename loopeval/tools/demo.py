"""``loopeval demo``: the whole protocol in miniature, on a laptop, with no downloads.

1. Make a synthetic reasoning task (``loopeval.tools.synthetic``): arithmetic word problems
   with worked, boxed solutions; train and a decontaminated test split.
2. Build a tiny Qwen3-style model and a BPE tokenizer trained on the task.
3. Train an unlooped twin and a looped model from it, identically (``loopeval.training``);
   with ``recipe="convert"``, fine-tune the base first, then convert it with LoRA.
4. Write a study file (``OUT/study.yaml``) and run it with the protocol runner
   (``loopeval.tools.study``): both models through lm-eval's ``looped`` model at 0.5, 1, 1.5
   and 2x the token budget, with and without budget forcing (16 real lm-eval runs, with
   traces), resumably.
   The twin's 8 runs start as soon as it is trained, while the looped model still trains.
5. The runner writes the two-test report (``loopeval.analysis.report``) to ``OUT/report.html``.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from loopeval.common.outputs import LOCK_NAME, folder_lock
from loopeval.evaluation.local_data import local_task
from loopeval.training.manifest import MANIFEST_NAME

TASK = "arith_boxed"
LOOP = "2:4x2"  # 6 layers -> 8 passes, c = 1.33
BUDGET = 48  # tokens at 1x; worked solutions take 20-41
SCALES = (0.5, 1.0, 1.5, 2.0)
BF_RESERVE = 12
BF_STRING = " The answer is \\boxed{"  # the solutions' own answer phrase
TRAIN_THREADS = 1
"""Per training process: the twin and the looped model train side by side (two cores),
each at one thread, whatever the load, so the demo's weights and figures do not depend
on the machine's load (a thread count changes float rounding). They do depend on the CPU
and the library versions: at this scale a rounding-level change moves the accuracies by
points (docs/benchmarks.md, "loopeval demo")."""


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
    # about 5 minutes on 2 CPU cores (249 to 308 s on an AVX-512 Xeon, docs/benchmarks.md); hidden 96 learns
    # the task as far as hidden 128 did for 0.6x the training FLOPs; 480 steps, since 600 took 329 s there
    "default": DemoSize(n_train=8000, n_test=250, steps=480, batch_size=32, layers=6, hidden=96, vocab=512, lr=4e-3),
    # a smoke test of every stage, for CI (about a minute)
    "tiny": DemoSize(n_train=400, n_test=24, steps=12, batch_size=8, layers=6, hidden=32, vocab=320, lr=3e-3),
}


def _say(message: str) -> None:
    print(f"[loopeval demo] {message}", flush=True)


def _task_folder(out: Path, test_file: Path) -> Path:
    """A task that is loopeval's ``gsm8k_boxed`` (prompt, scoring) on the local test split."""
    folder = out / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    config = local_task("gsm8k_boxed", "json", [test_file], cache_dir=out / "hf_cache", name=TASK,
                        generation_kwargs={"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": BUDGET})
    (folder / f"{TASK}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def write_study(out: Path, task_folder: Path, twin: Path, looped: Path | None) -> Path:
    """The demo's study file: both checkpoints, the local task, four budgets, plain decoding
    and budget forcing on both sides (``loopeval protocol`` runs it). With ``looped=None``,
    ``twin_study.yaml``: the same study of the twin alone, whose evaluations the full study
    reuses (they are joined by their settings and weights)."""
    models = [{"name": "twin", "role": "twin", "path": str(twin)}]
    if looped is not None:
        models.append({"name": "looped", "role": "looped", "path": str(looped)})
    study = {
        "name": "loopeval demo",
        "output": ".",
        "models": models,
        "tasks": [TASK],
        "include_path": [str(task_folder)],
        "budgets": list(SCALES),
        "decoding": [{"name": "plain"},
                     {"name": "bf", "budget_forcing": True, "bf_reserve": BF_RESERVE, "bf_string": BF_STRING}],
        "lm_eval": {"batch_size": 64, "device": "cpu", "dtype": "float32", "apply_chat_template": True},
        "report": {"title": "loopeval demo: does the loop pay for its compute?"},
    }
    path = out / ("study.yaml" if looped is not None else "twin_study.yaml")
    path.write_text(yaml.safe_dump(study, sort_keys=False, allow_unicode=True))
    return path


MARKER = "demo.json"
"""Written first, so a folder left by an interrupted demo is recognised as the demo's."""


def _mark(out: Path, settings: dict, **state) -> None:
    (out / MARKER).write_text(json.dumps({**settings, **state}))


def _checkpoints(out: Path) -> dict[str, str | None]:
    """The content of the trained checkpoints (:func:`loopeval.evaluation.identity.checkpoint_fingerprint`)."""
    from loopeval.evaluation.identity import checkpoint_fingerprint

    return {name: checkpoint_fingerprint(out / "checkpoints" / name) for name in ("twin", "looped")}


def _claim(out: Path, settings: dict) -> bool:
    """Take ``out`` for a demo with ``settings`` and return whether both models are already
    trained with them there: the checkpoints hold, by content, what the demo recorded when it
    trained them (weights deleted or changed since: trained again). A folder with files and no
    demo marker is refused; a demo folder (finished or interrupted) is resumed: the study
    runner skips the evaluations already done."""
    if out.exists() and any(p.name != LOCK_NAME for p in out.iterdir()):
        marker = out / MARKER
        try:
            stored = json.loads(marker.read_text())
        except (OSError, ValueError):
            raise ValueError(f"{out} exists and is not a loopeval demo folder; choose another --out") from None
        same = isinstance(stored, dict) and all(stored.get(k) == v for k, v in settings.items())
        trained = same and stored.get("status") in ("trained", "done") and all(
            (out / "checkpoints" / name / MANIFEST_NAME).is_file() for name in ("twin", "looped"))
        if trained and stored.get("checkpoints") != _checkpoints(out):
            trained = False
            _say(f"the checkpoints in {out / 'checkpoints'} are not the ones this demo trained (changed or "
                 "deleted since): training them again")
        elif stored.get("status") != "done":
            _say(f"resuming the demo interrupted in {out}" if same else
                 f"{out} holds an interrupted demo with other settings: starting again")
    else:
        trained = False
    out.mkdir(parents=True, exist_ok=True)
    if trained:
        _mark(out, settings, status="trained", checkpoints=_checkpoints(out))
    else:
        _mark(out, settings, status="started")
    return trained


def _train(out: Path, spec: DemoSize, train, train_file: Path, *, seed: int, recipe: str, on_trained) -> None:
    """Stages 2 and 3: the base model and tokenizer, then the twin and the looped model
    (``on_trained`` as in ``train_twins``)."""
    from loopeval.core.checkpoint import save_model
    from loopeval.evaluation.decoding import DEFAULT_ANSWER_STRING, DEFAULT_THINK_STRING
    from loopeval.evaluation.scoring import user_prompt
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer
    from loopeval.training import TrainConfig, train_model, train_twins

    if (out / "evals").exists():
        shutil.rmtree(out / "evals")  # evaluations of models an interrupted run had trained
    _say(f"2/5 tiny Qwen3 ({spec.layers} layers, hidden {spec.hidden}) and a BPE tokenizer, built locally")
    texts = [f"{user_prompt(p.question)} {p.solution}" for p in train] + [DEFAULT_THINK_STRING, DEFAULT_ANSWER_STRING]
    tokenizer = tiny_tokenizer(texts, vocab_size=spec.vocab)
    base = tiny_model("qwen3", seed=seed, vocab_size=len(tokenizer), num_layers=spec.layers, hidden=spec.hidden)
    save_model(base, tokenizer, out / "base")

    _say(f"3/5 training the twin and the looped model ({LOOP}), {spec.steps} steps each, at once: "
         f"{TRAIN_THREADS} thread each, so the figures do not depend on the machine's load")
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
    train_twins(start_from, train_file, loop=LOOP, out=out / "checkpoints", config=config, overwrite=True,
                parallel=True, threads=TRAIN_THREADS, on_trained=on_trained)


def run_demo(out: str | Path = "loopeval-demo", *, size: str = "default", seed: int = 0, recipe: str = "full") -> Path:
    """Run every stage into ``out`` and return the report's path. ``recipe="convert"``
    fine-tunes the base without a loop, then trains the twin and the looped model from
    it by LoRA conversion (paper A.3) for half the steps. The folder's lock is held for
    the whole run, so a second demo (any settings) on a folder whose demo still runs is
    refused, naming the running one."""
    if size not in SIZES:
        raise ValueError(f"demo size {size!r}: choose one of {', '.join(SIZES)}")
    if recipe not in ("full", "convert"):
        raise ValueError(f"demo recipe {recipe!r}: choose full or convert")
    out = Path(out).resolve()
    with folder_lock(out, "demo"):  # for the whole run: a second demo on a live folder is refused
        return _run_demo(out, SIZES[size], {"size": size, "seed": seed, "loop": LOOP, "recipe": recipe})


def _run_demo(out: Path, spec: DemoSize, settings: dict) -> Path:
    import torch

    from loopeval.common.threads import configure_threads
    from loopeval.tools.study import run_study
    from loopeval.tools.synthetic import make_splits, write_splits

    seed, recipe = settings["seed"], settings["recipe"]
    trained = _claim(out, settings)
    torch.set_num_threads(TRAIN_THREADS)  # fixed, as in training (TRAIN_THREADS); a user's OMP_NUM_THREADS still stands
    threads = configure_threads()
    for name in ("lm-eval", "lm_eval", "transformers", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    start = time.time()
    torch.manual_seed(seed)

    phases = {}
    reason = "fixed by the demo, as in each training process" if threads.source == "torch.set_num_threads" else threads.reason
    _say(f"torch threads for the evaluations: {threads.threads} ({reason}); training: {TRAIN_THREADS} per process")
    _say(f"1/5 synthetic task: {spec.n_train} training and {spec.n_test} test problems")
    train, test = make_splits(spec.n_train, spec.n_test, seed=seed)
    train_file, test_file = write_splits(out / "data", train, test)
    phases["data"] = time.time() - start

    task_folder = _task_folder(out, test_file)
    twin_path, looped_path = (out / "checkpoints" / name for name in ("twin", "looped"))
    study = write_study(out, task_folder, twin_path, looped_path)
    twin_study = write_study(out, task_folder, twin_path, None)

    def evaluate_twin(result) -> None:
        if result.manifest["role"] == "twin":
            _say(f"    the twin is trained: its {2 * len(SCALES)} lm-eval runs of the study start while the looped model trains")
            run_study(twin_study, report=False, progress=False)

    if trained:
        _say("2/5 and 3/5: the base and both trained models are kept from an earlier run with these settings")
    else:
        _train(out, spec, train, train_file, seed=seed, recipe=recipe, on_trained=evaluate_twin)
        _mark(out, settings, status="trained", checkpoints=_checkpoints(out))
    phases["train (the twin's runs meanwhile)"] = time.time() - start - sum(phases.values())

    _say(f"4/5 the {2 * 2 * len(SCALES)} lm-eval runs of the study {study}, finished ones kept (lm-eval's logs: {out / 'logs'})")
    _say(f"    twin and looped x budgets {', '.join(f'{s:g}x' for s in SCALES)}, budget forcing off and on")
    result = run_study(study)
    phases["evaluate and report"] = time.time() - start - sum(phases.values())
    if result.report is None:
        raise RuntimeError(f"the demo's evaluations failed: {'; '.join(result.failed)} (logs in {out / 'logs'})")

    _say("5/5 statistics and the report")
    data = json.loads((out / "report.json").read_text())
    report = result.report
    _mark(out, settings, status="done", checkpoints=_checkpoints(out), seconds=time.time() - start, phases=phases,
          threads=threads.to_dict())
    chance = Counter(p.answer for p in test).most_common(1)[0][1] / len(test)
    for row in data["decoding"]:
        _say(f"  {row['setting']:24s} accuracy {100 * row['macros']['points']:5.1f}%  cost {row['cost']['passes']:.2f}x layer passes")
    _say(f"  (always answering the most common test answer scores {100 * chance:.1f}%)")
    for cond in data["conditions"]:
        for sentence in cond["verdict"]["sentences"]:
            _say(f"  [{cond['label']}] {sentence}")
    _say(f"done in {time.time() - start:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in phases.items())}); "
         f"open {report}")
    return report
