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
    p.add_argument("--mix-source", default=None, choices=["window", "embedding"])
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    p.set_defaults(func=_check_cache)


def _check_cache(args) -> int:
    from loopeval.cache_check import run_check_cache_cli

    return run_check_cache_cli(args)


def _add_score_audit(sub) -> None:
    p = sub.add_parser(
        "score-audit",
        help="list the items of an lm-eval run whose verdict rests on a disputable scoring rule",
        description="Grade every response of RUN's boxed-answer tasks again and list those that used the GSM8K "
        "number fallback, hedged between option letters, held several different boxes, failed in math-verify, "
        "or compared an inequality with an interval; with counts per task. RUN is an lm-eval --output_path "
        "folder, its model folder or a results_*.json file written with --log_samples.",
    )
    p.add_argument("run", help="the lm-eval run")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups to audit (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    _add_reading_options(p)
    p.set_defaults(func=_score_audit)


def _score_audit(args) -> int:
    import json

    from loopeval.runs import load_run
    from loopeval.score_audit import score_audit

    run = load_run(args.run, tasks=args.tasks, allow_subset=args.allow_subset)
    audit = score_audit(run, unfinished_fallback=args.unfinished_fallback)
    print(json.dumps(audit.as_dict(), indent=2) if args.json else audit.to_text())
    return 0


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
    p.add_argument("--cost", choices=["passes", "flops"], default="passes",
                   help="how the cost ratio is charged: layer passes (the paper's rule, default) or traced FLOPs")
    p.add_argument("--test", choices=["bootstrap", "mcnemar"], default="bootstrap",
                   help="the test that decides each row (default: the paired bootstrap)")
    p.add_argument("--family", type=int, metavar="K", help="Bonferroni-adjust every interval for a family of K")
    p.add_argument("--cluster-field", metavar="FIELD", help="resample clusters of items sharing this doc field")
    p.add_argument("--n-resamples", type=int, default=10_000, help="bootstrap resamples (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    _add_reading_options(p)
    p.set_defaults(func=_compare)


def _add_reading_options(p) -> None:
    """How runs are read: a pilot's subset, and verdicts from cut responses (compare, report, score-audit)."""
    p.add_argument("--allow-subset", action="store_true",
                   help="a pilot: accept runs cut by lm_eval --limit; every table and the verdict say 'pilot: n of "
                   "N items' and no final verdict is stated")
    p.add_argument("--unfinished-fallback", choices=["credit", "wrong"], default="credit",
                   help="a right GSM8K number-fallback verdict from a response that did not finish (cut at its "
                   "budget, from the trace): credit it (the paper's rule, default) or score it wrong")


def _load_two(args, **options):
    from loopeval.runs import load_run, pair_runs
    from loopeval.score_audit import read_runs

    subset = getattr(args, "allow_subset", False)
    runs = {role: load_run(path, metric=args.metric, tasks=args.tasks, allow_subset=subset, **options)
            for role, path in (("baseline", args.baseline), ("candidate", args.candidate))}
    runs = read_runs(runs, getattr(args, "unfinished_fallback", "credit"))
    return runs, pair_runs(runs)


def _compare(args) -> int:
    import json

    from loopeval import console
    from loopeval.protocol import compare
    from loopeval.runs import decoding_differences

    runs, paired = _load_two(args, cluster_field=args.cluster_field)
    for diff in decoding_differences(runs["baseline"], runs["candidate"]):
        print(f"warning: the runs decode differently: {diff}", file=sys.stderr)
    result = compare(paired, "baseline", "candidate", resampler=paired.resampler(n_resamples=args.n_resamples,
                                                                                 seed=args.seed),
                     family=(args.family, "bonferroni") if args.family else None, test=args.test)
    traced = [t for t in paired.tasks if all(run.tasks[t].trace is not None for run in runs.values())]
    try:
        costs = {role: run.cost(traced, mode=args.cost) for role, run in runs.items()} if traced else None
    except ValueError as exc:
        costs = None
        print(f"note: no cost ratio ({exc})", file=sys.stderr)
    fallback = fallback_notes(runs, args.unfinished_fallback)
    if args.json:
        print(json.dumps({
            "tasks": {t: c.as_dict() for t, c in result.tasks.items()},
            "macro": result.macro.as_dict(),
            "runs": {role: str(run.path) for role, run in runs.items()},
            "labels": {role: run.label for role, run in runs.items()},
            "costs": costs,
            "c": _nominal_ratio(runs),
            "cost_mode": args.cost,
            "pilot": result.pilot,
            "unfinished_fallback": args.unfinished_fallback,
            "fallback_notes": fallback,
            "test": result.test,
            "confidence": result.confidence,
            "n_resamples": result.n_resamples,
            "seed": result.bootstrap_seed,
        }, indent=2))
        return 0
    print(console.comparison(result, runs, costs, args.cost, notes=fallback))
    return 0


def _nominal_ratio(runs) -> float | None:
    headers = [run.header for run in runs.values()]
    return None if None in headers else headers[1].multiplier / headers[0].multiplier


def fallback_notes(runs, unfinished_fallback: str) -> list[str]:
    """One line per run and task whose right verdicts rest on the number fallback of a response
    that did not finish (the looped model's trace says which)."""
    from loopeval.score_audit import fallback_tasks, score_audit

    lines = []
    for role, run in runs.items():
        for task, t in score_audit(run, tasks=fallback_tasks(run)).tasks.items():
            if t.unfinished_fallback_right:
                how = "scored wrong" if unfinished_fallback == "wrong" else "credited (--unfinished-fallback wrong to not)"
                n = t.unfinished_fallback_right
                lines.append(f"{role} {task}: {n} right verdict{'s' if n > 1 else ''} rest{'' if n > 1 else 's'} on the "
                             f"last number of a response cut at its budget ({t.unfinished_fallback} such fallbacks); {how}")
    return lines


def _add_power(sub) -> None:
    p = sub.add_parser(
        "power",
        help="minimum detectable difference, or items needed, from a paired pilot of two runs",
        description=(
            "Treat two lm-eval runs (written with --log_samples) as a paired pilot: per task and for the macro, "
            "print the per-item SD of CANDIDATE - BASELINE, the minimum detectable difference at the pilot's items "
            "(or --n), and with --delta the items needed to detect it. Two-sided normal approximation. The "
            "macro counts the items of all tasks together, in the pilot's proportions."
        ),
    )
    p.add_argument("baseline", help="baseline pilot run (e.g. the twin)")
    p.add_argument("candidate", help="candidate pilot run (e.g. the looped model)")
    p.add_argument("--delta", type=float, help="difference to detect, a fraction (0.02 = 2 points)")
    p.add_argument("--n", type=int, help="items at which to give the minimum detectable difference")
    p.add_argument("--alpha", type=float, default=0.05, help="two-sided level (default: 0.05)")
    p.add_argument("--power", type=float, default=0.8, help="power (default: 0.8)")
    p.add_argument("--metric", help="metric instead of each task's main one, e.g. exact_match,flexible-extract")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    p.set_defaults(func=_power)


def _power(args) -> int:
    import json
    from dataclasses import asdict

    from loopeval import console
    from loopeval.stats import power

    runs, paired = _load_two(args)
    a, b = paired.scores["baseline"], paired.scores["candidate"]
    options = dict(alpha=args.alpha, power=args.power, n=args.n, delta=args.delta)
    rows = {t: power(a[t], b[t], **options) for t in paired.tasks}
    rows["macro"] = power(a, b, **options)
    if args.json:
        print(json.dumps({
            "tasks": {t: asdict(r) for t, r in rows.items() if t != "macro"},
            "macro": asdict(rows["macro"]),
            "runs": {role: str(run.path) for role, run in runs.items()},
        }, indent=2))
        return 0
    print(console.power_table(rows, runs, **options))
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train an unlooped twin and a looped model identically (full, convert, cpt, joint or loop-convert)",
        description=(
            "Train BASE twice by one recipe on the same JSONL rows, batches, order, seeds and steps: without the "
            "loop into OUT/twin and with it into OUT/looped (or one of them with --only, for separate jobs). "
            "Recipes: full (full fine-tune), convert (LoRA through the loop, KL to the unmodified model, "
            "merged at the end), cpt (continued pretraining on packed text, held-out loss per pass count), "
            "joint (the single pass and the looped output of one model, optional distillation; paper 002). "
            "loop-convert (paper 004: a whole-decoder loop with a learned mix logit and an exit gate, smoothed exit loss). "
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
    p.add_argument("--mix-source", default=None, choices=["window", "embedding"],
                   help="what --mix mixes in: the window's input (default) or the token embedding")
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
        ("--single-weight", float, "joint: label weight of the single pass (default 0.1)"),
        ("--loop-weight", float, "joint: label weight of the looped output (default 0.9)"),
        ("--teacher", str, "joint: KD teacher frozen-original, online or frozen-looped (needs --receiver)"),
        ("--receiver", str, "joint: the output(s) the teacher guides: single, loop or both"),
        ("--kd-weight", float, "joint: KL weight, split evenly over the receivers (default 0.1)"),
        ("--stages", _stages, "joint: staged objectives NAME:STEPS,... (loop, single, joint) adding up to --steps"),
        ("--max-blocks", float, "stop before a step would pass this many forward blocks (teacher included)"),
        ("--max-seconds", float, "stop once the training steps have taken this many seconds"),
        ("--exit-beta", float, "loop-convert: entropy coefficient beta of the exit loss (default 0.15, paper 004)"),
        ("--exit-smoothing", float, "loop-convert: epsilon mixing the exit distribution with uniform in the LM loss (default 0.05)"),
        ("--mix-init", float, "loop-convert: initial mix logit a, w = sigmoid(a) (default 4.6, w = 0.99)"),
        ("--collapse-threshold", float, "loop-convert: p0 above which the exit gate counts as collapsed (default 0.95)"),
        ("--collapse-patience", int, "loop-convert: consecutive collapsed steps before a warning (default 50)"),
    ]:
        config.add_argument(flag, type=type_, default=argparse.SUPPRESS, help=help_)
    config.add_argument("--matched-ce", action="store_true",
                        help="joint: train the coefficient-matched CE control of the KD config given (no teacher)")
    config.add_argument("--activation-checkpointing", action="store_true", default=argparse.SUPPRESS,
                        help="recompute layer activations in the backward pass to save memory")
    p.set_defaults(func=_train)


def _passes(text: str) -> tuple[int, int]:
    from loopeval.training.config import parse_passes

    try:
        return parse_passes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stages(text: str):
    from loopeval.training.joint import parse_stages

    try:
        return parse_stages(text)
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
    if args.matched_ce:
        from loopeval.training.joint import matched_ce

        config = matched_ce(config)
    loop = dict(operator=args.operator, beta=args.beta, mix=args.mix, mix_source=args.mix_source)
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
              f"{m['flops']['train']:.3g} training FLOPs, {m['blocks']['total']:g} forward blocks, "
              f"{m['train_time_s']:.1f} s training" + (f", stopped by {m['budget']['stopped_by']} after "
                                                       f"{m['budget']['steps_run']} step(s)" if m['budget']['stopped_by'] else ""))
        if m.get("exit"):
            from loopeval.exit_monitor import collapse_notes

            last = ", ".join(f"{x:.3f}" for x in m["exit"]["p"][-1])
            print(f"        exit distribution at the last step: p = [{last}]; mix w = {m['mix']['weight']:.5f}; "
                  f"{m['parameters']['added']} parameters added (exit gate, mix logit)")
            for note in collapse_notes(m, str(r.path)):
                print(f"warning: {note}")
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


def _int_list(text: str) -> list[int]:
    """``"2-8"``, ``"2,3,4"`` or a mix (``"0-3,6"``)."""
    values = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            values += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers such as 2-8 or 2,3,4") from None
    return values


def _float_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers such as 0,0.25,0.5") from None


def _add_place(sub) -> None:
    p = sub.add_parser(
        "place",
        help="score where to put a loop: every window of a grid by calibrated perplexity PPL_T, PPL and KL",
        description=(
            "Score every window of a grid on held-out text (JSONL of {\"text\"} documents, split by hash into a "
            "validation part for temperature fitting and a test part for scoring): PPL_T, plain PPL and the mean KL "
            "to the unlooped model, which is the first row. Writes OUT/placements.jsonl (a re-run skips candidates "
            "already there) and OUT/placement.html, and prints the ranked table."
        ),
    )
    p.add_argument("--model", required=True, help="unlooped checkpoint folder or hub id")
    p.add_argument("--data", required=True, metavar="TEXT.jsonl")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--widths", type=_int_list, default=argparse.SUPPRESS, help="window widths (default 2-8)")
    p.add_argument("--times", type=_int_list, default=argparse.SUPPRESS, help="K, passes of the window (default 2,3,4)")
    p.add_argument("--betas", type=_float_list, default=argparse.SUPPRESS, help="anchors beta (default 0,0.25,0.5)")
    p.add_argument("--starts", type=_int_list, default=argparse.SUPPRESS, help="window starts (default: every layer)")
    p.add_argument("--operator", default=argparse.SUPPRESS, help="repeat or damped (default: damped)")
    p.add_argument("--mlp-loop", nargs="?", type=int, const=10, default=argparse.SUPPRESS, metavar="TOP",
                   help="also try the TOP windows (default 10) with one MLP-only loop (K=3) at their first layer")
    p.add_argument("--max-tokens", type=int, default=argparse.SUPPRESS, help="text tokens to use, in all")
    p.add_argument("--seq-len", type=int, default=argparse.SUPPRESS, help="tokens per row (default 1024)")
    p.add_argument("--val-fraction", type=float, default=argparse.SUPPRESS, help="share of documents for validation (0.5)")
    p.add_argument("--batch-tokens", type=int, default=argparse.SUPPRESS, help="tokens per layer call (default 8192)")
    p.add_argument("--rank-by", default=argparse.SUPPRESS, help="ppl_t (default), ppl or kl")
    p.add_argument("--correlate", metavar="RESULTS.jsonl", default=argparse.SUPPRESS,
                   help='benchmark accuracies, {"loop", "operator", "beta", "accuracy"} rows: Spearman rho per score')
    p.add_argument("--dtype", default=argparse.SUPPRESS, help="weight dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--device", default=argparse.SUPPRESS, help="default: cuda if available, else cpu")
    p.add_argument("--top", type=int, default=20, help="rows of the printed table (default 20)")
    p.set_defaults(func=_place)


def _place(args) -> int:
    from loopeval.placement import place
    from loopeval.placement.report import format_correlations, format_table

    options = {k: v for k, v in vars(args).items() if k not in ("command", "func", "model", "data", "out", "top")}
    if "correlate" in options:
        options["results"] = options.pop("correlate")
    result = place(args.model, args.data, out=args.out, **options)
    print(format_table(result, top=args.top))
    if result.correlations:
        print(format_correlations(list(result.correlations)))
    print(f"{result.scored} candidates scored in {result.wall_s:.1f} s ({result.layer_passes:.1f} layer passes per "
          f"text position); wrote {result.out / 'placements.jsonl'} and {result.out / 'placement.html'}")
    return 0


def _batch_sizes(text: str):
    return "auto" if text.strip() == "auto" else _int_list(text)


def _add_serve_cost(sub) -> None:
    p = sub.add_parser(
        "serve-cost",
        help="latency, throughput and memory of looped against unlooped decoding (the paper's Table 10)",
        description="Measures, interleaved in one process: prefill time, decode latency per token at batch 1 "
        "(prefill excluded), throughput at each batch size, peak memory at batch 1 and the memory growth per "
        "token next to loop_cost's KV bytes; prints each ratio next to c and writes OUT/serve_cost.json. One "
        "--model with --loop (or its own loop) is compared with its unlooped self; several --model are compared "
        "with the first.",
    )
    p.add_argument("--model", action="append", required=True, help="checkpoint folder or hub id (repeatable; the "
                   "first is the baseline)")
    p.add_argument("--loop", help="loop spec for a single --model, e.g. 8:16x2")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", type=_batch_sizes, default="auto",
                   help="auto (default: the largest batch that fits on CUDA; see docs/serving.md for CPU) or 1,8,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (needs --cache static)")
    p.add_argument("--device", help="default: cuda if available, else cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the checkpoint's")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_serve_cost)


def _serve_cost(args) -> int:
    from loopeval.serving import serve_cost

    result = serve_cost(args.model, loop=args.loop, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                        batch_sizes=args.batch_sizes, repeats=args.repeats, compile=args.compile, cache=args.cache,
                        device=args.device, dtype=args.dtype, out=args.out)
    print(result.to_text())
    print(f"wrote {args.out}/serve_cost.json")
    return 0


# Subcommands are listed here in the order `loopeval --help` shows them.
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write the two-test HTML report from lm-eval runs of a looped model and its twin",
        description="Runs are lm-eval --output_path folders made with --model looped and trace=; each run's loop, "
        "budget scale and decoding rules are read from its trace, its training seed and variant from the "
        "training_manifest.json beside its checkpoint (or --seed / --variant). Give one run per budget, decoding "
        "rule, training variant and seed.",
    )
    p.add_argument("--twin", nargs="+", required=True, metavar="RUN", help="the unlooped twin's evaluations")
    p.add_argument("--looped", nargs="+", required=True, metavar="RUN", help="the looped model's evaluations")
    p.add_argument("--larger", metavar="RUN", help="a larger unlooped model: a comparator that may cost more")
    p.add_argument("--sizes", nargs=2, type=float, metavar=("SMALL", "LARGE"),
                   help="parameter counts of the twin and the larger model, for the ceiling of Eq. 4 (Table 5)")
    p.add_argument("--seed", action="append", default=[], metavar="RUN=N", dest="seeds",
                   help="the training seed of a run without a manifest (repeatable)")
    p.add_argument("--variant", action="append", default=[], metavar="RUN=LABEL", dest="variants",
                   help="the training variant of a run, e.g. runs/twin_3x=3x-FT (repeatable)")
    p.add_argument("--training", nargs=2, action="append", default=[], metavar=("TWIN", "LOOPED"),
                   help="checkpoints of a twin pair whose manifests hold held-out curves (Fig. 3 and 5; repeatable)")
    p.add_argument("--serve-cost", nargs="+", default=[], metavar="DIR",
                   help="loopeval serve-cost output folders: adds the serving section (Table 10)")
    p.add_argument("--wall-clock", action="store_true",
                   help="Figure 2 on measured time: looped points at the --serve-cost latency ratio instead of c")
    p.add_argument("--cost", choices=["passes", "flops"], default="passes",
                   help="charge layer passes (the paper's rule, default) or traced FLOPs")
    p.add_argument("--selection", choices=["fixed", "resampled"], default="fixed",
                   help="choose the best cheaper comparator on the test items (default) or in every resample")
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--template", default="report.html.j2", help="a Jinja2 template (default: loopeval's own)")
    p.add_argument("--json", metavar="FILE", help="also write the report data as JSON")
    p.add_argument("--latex", action="store_true", help="also write every table as LaTeX (booktabs) beside the report")
    p.add_argument("--title")
    p.add_argument("--default-scale", type=float, default=1.0, help="the budget scale of the Δparam test (default 1)")
    p.add_argument("--n-resamples", type=int, default=10_000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail instead of warning when a fairness check fails")
    _add_reading_options(p)
    p.set_defaults(func=_report)


def _assignments(pairs: list[str], flag: str, convert) -> dict[str, object]:
    out = {}
    for pair in pairs:
        run, sep, value = pair.rpartition("=")
        if not sep or not run:
            raise ValueError(f"{flag} {pair!r}: expected RUN=VALUE")
        out[run] = convert(flag, value)
    return out


def _report(args) -> int:
    from pathlib import Path

    from loopeval.args import as_int, as_text
    from loopeval.paths import reports_path
    from loopeval.report import RunSpec, build_report, check_output, write_report

    out = check_output(args.out)  # before any work
    if args.json:
        check_output(args.json, "--json")
    template = Path(args.template)
    if not (template.is_file() or (reports_path() / template.name).is_file()):
        raise ValueError(f"--template {args.template}: no such template file")
    seeds = _assignments(args.seeds, "--seed", as_int)
    variants = _assignments(args.variants, "--variant", as_text)
    given = set(args.twin) | set(args.looped) | ({args.larger} if args.larger else set())
    stray = sorted((set(seeds) | set(variants)) - given)
    if stray:
        raise ValueError(f"--seed/--variant name {', '.join(stray)}, which is not among the runs given")

    def spec(run: str) -> RunSpec:
        return RunSpec(run, seed=seeds.get(run), variant=variants.get(run))

    data = build_report(
        [spec(r) for r in args.twin], [spec(r) for r in args.looped], larger=spec(args.larger) if args.larger else None,
        sizes=tuple(args.sizes) if args.sizes else None, default_scale=args.default_scale, cost=args.cost,
        selection=args.selection, training_pairs=[tuple(pair) for pair in args.training],
        serve_cost=args.serve_cost, wall_clock=args.wall_clock, title=args.title,
        strict=args.strict, n_resamples=args.n_resamples, seed=args.bootstrap_seed,
        allow_subset=args.allow_subset, unfinished_fallback=args.unfinished_fallback,
    )
    path = write_report(data, out, template=args.template, latex_tables=args.latex)
    if args.json:
        Path(args.json).write_text(data.to_json())
    for cond in data.conditions:
        for sentence in cond.verdict.sentences:
            print(f"[{cond.label}] {sentence}")
    for check in data.failed_checks:
        print(f"FAILED CHECK {check.name}: {check.detail}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _add_protocol(sub) -> None:
    p = sub.add_parser(
        "protocol",
        help="run every evaluation of a two-test study (resumably, in parallel) and write its report",
        description="STUDY.yaml names the models, tasks, budgets, decoding rules and lm-eval settings "
        "(docs/protocol.md). The study is validated and checked for fairness before anything runs; finished "
        "evaluations are skipped, a killed one resumes, and the report is written to OUTPUT/report.html.",
    )
    p.add_argument("study", help="the study file (YAML)")
    p.add_argument("--dry-run", action="store_true", help="print every evaluation, whether it is done, and its budgeted cost")
    p.add_argument("--only", metavar="PATTERN", help="run only the evaluations whose names match this glob")
    p.add_argument("--report-only", action="store_true", help="run nothing; rebuild the report from finished evaluations")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=1, help="parallel worker processes on the CPU (default 1)")
    where.add_argument("--devices", help="one worker per device, e.g. cuda:0,cuda:1")
    p.set_defaults(func=_protocol)


def _protocol(args) -> int:
    from loopeval.study import run_study

    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    result = run_study(args.study, dry_run=args.dry_run, only=args.only, report_only=args.report_only,
                       workers=args.workers, devices=devices)
    for name in result.failed:
        print(f"FAILED {name}: {result.outcomes[name]}", file=sys.stderr)
    if result.report is not None:
        print(f"wrote {result.report}")
    return 1 if result.failed else 0


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


_SUBCOMMANDS = [_add_demo, _add_check_cache, _add_place, _add_decontaminate, _add_train, _add_protocol,
                _add_compare, _add_power, _add_report, _add_serve_cost, _add_score_audit, _add_tasks_path]


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
    """Run one subcommand. Expected failures (bad input, files, options, templates) print
    one line on stderr and exit 2; ``LOOPEVAL_DEBUG=1`` shows the traceback instead."""
    import os

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        if os.environ.get("LOOPEVAL_DEBUG"):
            raise
        message = str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.filename}: {exc.strerror}"
        print(f"loopeval {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loopeval {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
