"""The ``loopeval`` command line. Each subcommand is an ``_add_<name>`` function that
registers its parser and binds ``func``; heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import sys

from loopeval.manifest import RECIPES


def _add_check_cache(sub) -> None:
    p = sub.add_parser(
        "check-cache",
        help="compare cached greedy decoding of a (looped) model with full recomputation",
        description="Exit status 0 when cached decoding equals full recomputation, 1 on a mismatch.",
    )
    p.add_argument("--model", help="checkpoint path or hub id (default: a tiny random Qwen3 built on the fly)")
    p.add_argument("--loop", help="loop spec such as 8:16x2 (default: the checkpoint's own loop, if any)")
    p.add_argument("--operator", default=None, choices=["repeat", "damped"])
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--mix", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    p.set_defaults(func=_check_cache)


def _check_cache(args) -> int:
    from loopeval.cache_check import run_check_cache_cli

    return run_check_cache_cli(args)


def _add_tasks_path(sub) -> None:
    p = sub.add_parser("tasks-path", help="print the folder to pass to lm_eval --include_path")
    p.set_defaults(func=_tasks_path)


def _tasks_path(args) -> int:
    from loopeval.paths import tasks_path

    print(tasks_path())
    return 0


def _add_compare(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="paired statistics of two lm-eval runs: bootstrap, McNemar, TOST",
        description=(
            "Compare CANDIDATE with BASELINE item by item, per task and on the macro (unweighted mean over "
            "leaf tasks): accuracies, difference in points, paired-bootstrap 95%% interval and two-sided p, "
            "exact McNemar p on 0/1 tasks, and TOST equivalence (90%% interval inside +-2 points). A run is an "
            "lm-eval --output_path folder, its model folder or a results_*.json file written with --log_samples. "
            "Exit status 2, with the reason on stderr, when the runs cannot be paired."
        ),
    )
    p.add_argument("baseline", help="baseline run (e.g. the twin)")
    p.add_argument("candidate", help="candidate run (e.g. the looped model)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    p.add_argument("--metric", help="metric instead of each task's main one, e.g. exact_match,flexible-extract")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups to compare (default: all)")
    p.add_argument("--n-resamples", type=int, default=10_000, help="bootstrap resamples (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    p.set_defaults(func=_compare)


def _compare(args) -> int:
    import json

    from loopeval.protocol import compare
    from loopeval.runs import decoding_differences, load_run, pair_runs
    from loopeval.stats.display import points, pvalue

    runs = {role: load_run(path, metric=args.metric, tasks=args.tasks)
            for role, path in (("baseline", args.baseline), ("candidate", args.candidate))}
    paired = pair_runs(runs)
    for diff in decoding_differences(runs["baseline"], runs["candidate"]):
        print(f"warning: the runs decode differently: {diff}", file=sys.stderr)
    result = compare(paired, "baseline", "candidate",
                     resampler=paired.resampler(n_resamples=args.n_resamples, seed=args.seed))
    if args.json:
        print(json.dumps({
            "tasks": {t: c.as_dict() for t, c in result.tasks.items()},
            "macro": result.macro.as_dict(),
            "runs": {role: str(run.path) for role, run in runs.items()},
            "n_resamples": result.n_resamples,
            "seed": result.bootstrap_seed,
        }, indent=2))
        return 0
    for role, run in runs.items():
        print(f"{role:<9}  {run.path}  ({run.name})")
    print(f"paired bootstrap over items, {result.n_resamples} resamples, seed {result.bootstrap_seed}; "
          f"equivalent: 90% interval inside ±{points(result.margin)} points\n")
    header = ("task", "metric", "n", "baseline", "candidate", "delta", "95% CI", "p", "McNemar p", "equivalent")
    lines = [
        (name, runs["baseline"].tasks[c.task].metric if c.task else "", str(c.n),
         points(c.baseline_accuracy), points(c.candidate_accuracy), points(c.delta, signed=True),
         f"[{points(c.ci.low, signed=True)}, {points(c.ci.high, signed=True)}]", pvalue(c.pvalue),
         pvalue(c.mcnemar_pvalue), "yes" if c.equivalent else "no")
        for name, c in [*result.tasks.items(), ("macro", result.macro)]
    ]
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header))]
    for row in (header, *lines):
        print("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip())
    if result.seeds:
        print(f"\nseed runs favouring the candidate: {result.seeds}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train an unlooped twin and a looped model identically (full, convert or cpt)",
        description=(
            "Train BASE twice by one recipe on the same JSONL rows, batches, order, seeds and steps: without the "
            "loop into OUT/twin and with it into OUT/looped (or one of them with --only, for separate jobs). "
            "Recipes: full (full fine-tune), convert (LoRA through the loop, KL to the unmodified model, "
            "merged at the end), cpt (continued pretraining on packed text, held-out loss per pass count). "
            "Each folder is a checkpoint with training_manifest.json. Options left out take TrainConfig's "
            "defaults (docs/training.md). Data-parallel: accelerate launch -m loopeval train ..."
        ),
    )
    p.add_argument("--base", required=True, help="unlooped checkpoint folder or hub id")
    p.add_argument("--data", required=True, help='JSONL of {"prompt", "completion"} and/or {"text"} rows')
    p.add_argument("--loop", help="loop spec of the looped model, e.g. 8:16x2 (required unless --only twin)")
    p.add_argument("--out", required=True, help="output folder; the models go to OUT/twin and OUT/looped")
    p.add_argument("--only", choices=["twin", "looped"], help="train only this one of the two")
    p.add_argument("--heldout", help="JSONL rows kept out of training, measured at every checkpoint (required by cpt)")
    p.add_argument("--keep-adapters", action="store_true", help="convert: also save the unmerged adapters to OUT/*/adapter")
    p.add_argument("--operator", default="repeat", choices=["repeat", "damped"])
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--mix", type=float, default=None, help="fixed input-mixing logit (not learned)")
    p.add_argument("--overwrite", action="store_true", help="write into non-empty output folders")
    config = p.add_argument_group("training (TrainConfig)")
    config.add_argument("--recipe", default=argparse.SUPPRESS, choices=RECIPES, help="default: full")
    for flag, type_, help_ in [
        ("--steps", int, "optimizer steps"),
        ("--batch-size", int, "global batch, in rows"),
        ("--micro-batch-size", int, "rows per forward on each process"),
        ("--lr", float, "peak learning rate (default per recipe)"),
        ("--min-lr-ratio", float, "final learning rate / peak (default per recipe; cpt: 1, constant)"),
        ("--warmup", int, "linear warm-up steps"),
        ("--weight-decay", float, "AdamW weight decay of matrices and embeddings"),
        ("--grad-clip", float, "gradient-norm clip; 0: off"),
        ("--max-length", int, "tokens per row; longer rows are cut (cpt: the packed row length)"),
        ("--seed", int, "training seed (dropout, LoRA initialisation, loop draws)"),
        ("--data-seed", int, "batch-order seed"),
        ("--dtype", str, "weight dtype: float32, bfloat16 or float16"),
        ("--log-every", int, "steps per loss-curve point"),
        ("--save-every", int, "steps between intermediate checkpoints and held-out measurements (full, cpt)"),
        ("--lora-rank", int, "convert: LoRA rank"),
        ("--lora-alpha", float, "convert: LoRA alpha (scale alpha/rank)"),
        ("--lora-dropout", float, "convert: LoRA dropout"),
        ("--lora-targets", _lora_targets, "convert: all-linear (default), module names a,b,c, or a regular expression"),
        ("--kl-weight", float, "convert: weight of KL(teacher || student) (default 0.9)"),
        ("--nll-weight", float, "convert: weight of the NLL (default 0.1)"),
        ("--curriculum", float, "convert: fraction of steps over which p(loop) rises 0 -> 1 (default 1/3)"),
        ("--passes", _passes, "cpt: random depth, every window's passes drawn per batch from a range, e.g. 1-3"),
    ]:
        config.add_argument(flag, type=type_, default=argparse.SUPPRESS, help=help_)
    config.add_argument("--activation-checkpointing", action="store_true", default=argparse.SUPPRESS,
                        help="recompute layer activations in the backward pass to save memory")
    p.set_defaults(func=_train)


def _passes(text: str) -> tuple[int, int]:
    from loopeval.training.config import parse_passes

    try:
        return parse_passes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lora_targets(text: str):
    from loopeval.training.config import parse_targets

    return parse_targets(text)


def _train(args) -> int:
    from dataclasses import fields
    from pathlib import Path

    from accelerate import PartialState

    from loopeval.manifest import twin_mismatches
    from loopeval.training.config import TrainConfig
    from loopeval.training.runner import LOOPED, TWIN
    from loopeval.training.twins import train_model, train_twins

    if args.loop is None and args.only != TWIN:
        raise ValueError("--loop is required unless --only twin")
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)})
    loop = dict(operator=args.operator, beta=args.beta, mix=args.mix)
    common = dict(config=config, overwrite=args.overwrite, heldout=args.heldout, keep_adapters=args.keep_adapters)
    out = Path(args.out)
    if args.only == TWIN:
        results = [train_model(args.base, args.data, out=out / TWIN, **common)]
    elif args.only == LOOPED:
        results = [train_model(args.base, args.data, out=out / LOOPED, loop=args.loop, **loop, **common)]
    else:
        results = list(train_twins(args.base, args.data, loop=args.loop, out=out, **loop, **common))
    if not PartialState().is_main_process:  # one report under data-parallel launchers
        return 0
    for r in results:
        m = r.manifest
        loss = " -> ".join(f"{x:.4f}" for _, x in (m["loss_curve"][0], m["loss_curve"][-1])[:len(m["loss_curve"])])
        print(f"{m['role']:<6}  {r.path}  {m['recipe']}: loss {loss}, {m['tokens']['input']} tokens, "
              f"{m['flops']['train']:.3g} training FLOPs, {m['train_time_s']:.1f} s training")
        for point in m["heldout_curve"]:
            by = ", ".join(f"{k}: {v:.4f}" for k, v in point.get("loss_by_passes", {}).items())
            print(f"        held-out loss at step {point['step']}: {point['loss']:.4f}" + (f" (by passes {by})" if by else ""))
    data = results[0].manifest["data"]
    if data["rows_truncated"]:
        print(f"{data['rows_truncated']} of {data['rows']} rows were cut to --max-length {config.max_length}")
    if data["decontamination"] is None:
        print(f"note: {data['path']} was not made by `loopeval decontaminate`; the manifests record it as not decontaminated")
    if len(results) == 2:
        mismatches = twin_mismatches(results[0].manifest, results[1].manifest)
        print("twins: identical apart from the loop" if not mismatches else "twins DIFFER: " + "; ".join(mismatches))
    return 0


def _add_decontaminate(sub) -> None:
    p = sub.add_parser(
        "decontaminate",
        help="remove training rows that share an n-gram of lower-cased words with lm-eval test sets",
        description=(
            "Copy DATA (JSONL) to --out without every row that shares an n-gram (default 13) of lower-cased words "
            "with a test document of the given lm-eval tasks or groups (default: the paper's GSM8K test, MATH-500, "
            "AIME 2024/2025 and GPQA-Diamond). Writes OUT.removed.jsonl (row, task, doc_id, shared n-gram) and "
            "OUT.decontamination.json, which training records in its manifest."
        ),
    )
    p.add_argument("data", help="training JSONL")
    p.add_argument("--against", type=lambda s: [t.strip() for t in s.split(",") if t.strip()], default=None,
                   metavar="TASK[,TASK...]", help="lm-eval tasks or groups (default: the paper's five test sets)")
    p.add_argument("--out", required=True, help="the decontaminated JSONL")
    p.add_argument("--n", type=int, default=None, help="n-gram length in words (default 13)")
    p.add_argument("--include-path", action="append", help="folder of further lm-eval task YAMLs (repeatable)")
    p.add_argument("--removed", help="where to list the removed rows (default OUT.removed.jsonl)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.set_defaults(func=_decontaminate)


def _decontaminate(args) -> int:
    from loopeval.training.decontamination import DEFAULT_N, PAPER_TEST_SETS, decontaminate

    result = decontaminate(args.data, out=args.out, against=args.against or PAPER_TEST_SETS,
                           n=args.n if args.n is not None else DEFAULT_N, include_path=args.include_path,
                           removed=args.removed, overwrite=args.overwrite)
    print(f"kept {result.kept} of {result.rows} rows -> {result.out}")
    print(f"removed {result.removed} -> {result.removed_path}"
          + "".join(f"\n  {task}: {n} rows" for task, n in result.removed_by_task.items()))
    print(f"record -> {result.record_path}")
    return 0


# Subcommands are listed here in the order `loopeval --help` shows them.
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write the two-test HTML report from lm-eval runs of a looped model and its twin",
        description="Runs are lm-eval --output_path folders made with --model looped and trace=; each run's loop, "
        "budget scale and decoding rules are read from its trace. Give one run per budget (and per training seed).",
    )
    p.add_argument("--twin", nargs="+", required=True, metavar="RUN", help="the unlooped twin's evaluations")
    p.add_argument("--looped", nargs="+", required=True, metavar="RUN", help="the looped model's evaluations")
    p.add_argument("--larger", metavar="RUN", help="a larger unlooped model, a further equal-FLOPs comparator")
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--template", default="report.html.j2", help="a Jinja2 template (default: loopeval's own)")
    p.add_argument("--json", metavar="FILE", help="also write the report data as JSON")
    p.add_argument("--title")
    p.add_argument("--default-scale", type=float, default=1.0, help="the budget scale of the Δparam test (default 1)")
    p.add_argument("--n-resamples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail instead of warning when a fairness check fails")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from pathlib import Path

    from loopeval.report import build_report, write_report

    data = build_report(
        args.twin, args.looped, larger=args.larger, default_scale=args.default_scale, title=args.title,
        strict=args.strict, n_resamples=args.n_resamples, seed=args.seed,
    )
    path = write_report(data, args.out, template=args.template)
    if args.json:
        Path(args.json).write_text(data.to_json())
    for cond in data.conditions:
        for sentence in cond.verdict.sentences:
            print(f"[{cond.label}] {sentence}")
    for check in data.failed_checks:
        print(f"FAILED CHECK {check.name}: {check.detail}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the protocol end to end on tiny local models: data, twin training, 16 lm-eval runs, report",
        description="Makes a synthetic arithmetic task, trains a tiny twin and looped model on CPU, evaluates both "
        "through lm-eval's looped model at 0.5-2x budgets with and without budget forcing, and writes the report.",
    )
    p.add_argument("--out", default="loopeval-demo", help="output folder (default: ./loopeval-demo)")
    p.add_argument("--size", default="default", choices=["default", "tiny"], help="tiny: a one-minute smoke test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", default="full", choices=["full", "convert"],
                   help="convert: fine-tune the base, then convert it with LoRA through the loop (and its twin)")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    from loopeval.demo import run_demo

    run_demo(args.out, size=args.size, seed=args.seed, recipe=args.recipe)
    return 0


_SUBCOMMANDS = [_add_demo, _add_check_cache, _add_decontaminate, _add_train, _add_compare, _add_report, _add_tasks_path]


def build_parser() -> argparse.ArgumentParser:
    from loopeval import __version__

    parser = argparse.ArgumentParser(
        prog="loopeval",
        description="Does looping a trained language model pay for its inference compute?",
    )
    parser.add_argument("--version", action="version", version=f"loopeval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line on stderr, no traceback.
        print(f"loopeval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
