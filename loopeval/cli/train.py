"""``loopeval train``: its TrainConfig flags are derived from the config's fields."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from loopeval.cli._common import add_loop_options, loop_options


def add(sub) -> None:
    from loopeval.training.config import DTYPES, FIELD_HELP, TrainConfig, parse_passes, parse_stages, parse_targets
    from loopeval.training.manifest import RECIPES

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
    p.add_argument("--overwrite", action="store_true", help="write into non-empty output folders")
    add_loop_options(p, what="the looped model")
    config = p.add_argument_group("training (TrainConfig)")
    parsers = {"passes": _typed(parse_passes), "stages": _typed(parse_stages), "lora_targets": parse_targets}
    choices = {"recipe": RECIPES, "dtype": DTYPES}
    for f in fields(TrainConfig):
        if f.name not in FIELD_HELP:
            continue
        flag, default = "--" + f.name.replace("_", "-"), f.default if f.default is not MISSING else None
        help_ = FIELD_HELP[f.name] + ("" if default is None or "default" in FIELD_HELP[f.name] else f" (default {default:g})"
                                      if isinstance(default, float) else f" (default {default})")
        if f.type in (bool, "bool"):
            config.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=FIELD_HELP[f.name])
        elif f.name in choices:
            config.add_argument(flag, choices=choices[f.name], default=argparse.SUPPRESS, help=help_)
        else:
            config.add_argument(flag, type=parsers.get(f.name, _scalar(f)), default=argparse.SUPPRESS, help=help_)
    config.add_argument("--matched-ce", action="store_true",
                        help="joint: train the coefficient-matched CE control of the KD config given (no teacher)")
    p.set_defaults(func=run)


def _scalar(f):
    kind = str(f.type).replace(" | None", "")
    return {"int": int, "float": float}.get(kind, str)


def _typed(parse):
    def parse_flag(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_flag


def run(args) -> int:
    import os
    from contextlib import nullcontext
    from pathlib import Path

    from accelerate import PartialState

    from loopeval.common.outputs import check_outputs, folder_lock
    from loopeval.training.config import TrainConfig
    from loopeval.training.manifest import twin_mismatches
    from loopeval.training.runner import LOOPED, TWIN
    from loopeval.training.twins import train_model, train_twins

    if args.loop is None and args.only != TWIN:
        raise ValueError("--loop is required unless --only twin")
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)})
    if args.matched_ce:
        from loopeval.training.joint import matched_ce

        config = matched_ce(config)
    loop = loop_options(args)
    common = dict(config=config, overwrite=args.overwrite, heldout=args.heldout, keep_adapters=args.keep_adapters)
    out = Path(args.out)
    check_outputs({"--out": out}, [args.base, args.data, args.heldout])
    main_rank = os.environ.get("RANK", "0") == "0"  # data-parallel ranks share rank 0's lock
    with folder_lock(out, "train") if main_rank else nullcontext():
        if args.only == TWIN:
            results = [train_model(args.base, args.data, out=out / TWIN, **common)]
        elif args.only == LOOPED:
            results = [train_model(args.base, args.data, out=out / LOOPED, loop=args.loop, **loop, **common)]
        else:
            results = list(train_twins(args.base, args.data, loop=args.loop, out=out, **loop, **common))
    if not PartialState().is_main_process:  # one report under data-parallel launchers
        return 0
    for r in results:
        print(r)
    data = results[0].manifest["data"]
    if data["rows_truncated"]:
        print(f"{data['rows_truncated']} of {data['rows']} rows were cut to --max-length {config.max_length}")
    if data["decontamination"] is None:
        print(f"note: {data['path']} was not made by `loopeval decontaminate`; the manifests record it as not decontaminated")
    if len(results) == 2:
        mismatches = twin_mismatches(results[0].manifest, results[1].manifest)
        print("twins: identical apart from the loop" if not mismatches else "twins DIFFER: " + "; ".join(mismatches))
    return 0
