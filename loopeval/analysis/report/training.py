"""The report's training section: held-out loss of twin and looped model against training
tokens (the paper's Fig. 3) and the token exchange rate r(D) (Fig. 5), from training
manifests with held-out curves, and the training cost of every method (forward blocks
and seconds) where manifests record it. It reads manifests only (``loopeval.training.exchange``,
``loopeval.training.manifest``), never training code."""

from __future__ import annotations

from pathlib import Path

from loopeval.training.exchange import training_curves
from loopeval.training.exit_monitor import collapse_notes
from loopeval.training.manifest import manifest_recipe, read_manifest
from loopeval.analysis.report.evaluations import Evaluation


def pairs_from_evaluations(evals: list[Evaluation]) -> list[tuple[str, dict, dict]]:
    """(label, twin manifest, looped manifest) for every variant and seed whose evaluated
    checkpoints both carry a held-out curve."""
    twins = {(e.variant, e.seed): e.manifest for e in evals if not e.looped and e.manifest}
    out, seen = [], set()
    for e in evals:
        key = (e.variant, e.seed)
        if not e.looped or not e.manifest or key in seen or key not in twins:
            continue
        if e.manifest.get("heldout_curve") and twins[key].get("heldout_curve"):
            seen.add(key)
            label = ", ".join(str(x) for x in (e.variant, f"seed {e.seed}" if e.seed is not None else "") if x)
            out.append((label or "twin pair", twins[key], e.manifest))
    return out


def pairs_from_paths(paths: list[tuple[str | Path, str | Path]]) -> list[tuple[str, dict, dict]]:
    """(label, twin manifest, looped manifest) for given (twin, looped) checkpoint folders."""
    out = []
    for twin, looped in paths:
        a, b = read_manifest(twin), read_manifest(looped)
        if a.get("loop") is not None or b.get("loop") is None:
            raise ValueError(f"training pair ({twin}, {looped}): give the twin's checkpoint first, then the looped one")
        out.append((f"{Path(twin).name} / {Path(looped).name}", a, b))
    return out


def section(pairs: list[tuple[str, dict, dict]]) -> list[dict]:
    """Plot-ready curves of each pair (``exchange.TrainingCurves.to_dict()``) with its label."""
    return [{"label": label, **training_curves(twin, looped).to_dict()} for label, twin, looped in pairs]


def method(manifest: dict) -> str:
    """A training manifest's method in words: its recipe and, for ``joint``, its weights,
    teacher and receiver, matched-CE origin and stages."""
    recipe = manifest_recipe(manifest)
    config = manifest.get("config", {})
    if recipe != "joint" or manifest.get("loop") is None:
        return recipe if manifest.get("loop") is not None else f"{recipe} (twin)"
    words = [f"joint CE {config['single_weight']:g}/{config['loop_weight']:g}"]
    if config.get("teacher"):
        words.append(f"KD {config['teacher']} -> {config['receiver']} ({config['kd_weight']:g})")
    if config.get("matched_from"):
        words.append(f"matched CE of {config['matched_from']}")
    if config.get("stages"):
        words.append("stages " + ",".join(f"{name}:{steps}" for name, steps in config["stages"]))
    return ", ".join(words)


def costs(pairs: list[tuple[str, dict, dict]], evals: list[Evaluation]) -> list[dict]:
    """One row per trained model whose manifest records forward blocks: its method,
    steps run, forward blocks (teacher included, a shared prefix once) and training
    seconds, in total and per step, and the cap that stopped it (002 compares methods
    at equal blocks and at equal time). Models are told apart by their final weights."""
    named = [(f"{label}: {side}", m) for label, twin, looped in pairs for side, m in (("twin", twin), ("looped", looped))]
    named += [(e.where.name, e.manifest) for e in evals if e.manifest]
    rows, seen = [], set()
    for name, m in named:
        key = m.get("final_weights_sha256") or id(m)
        if "blocks" not in m or key in seen:
            continue
        seen.add(key)
        steps = m["budget"]["steps_run"]
        rows.append({"model": name, "method": method(m), "steps": steps, "blocks": m["blocks"]["total"],
                     "teacher_blocks": m["blocks"]["teacher"], "blocks_per_step": m["blocks"]["total"] / steps,
                     "seconds": m["train_time_s"], "seconds_per_step": sum(m["step_seconds"]) / steps,
                     "stopped_by": m["budget"]["stopped_by"]})
    return rows


def undecontaminated(evals: list[Evaluation]) -> list[str]:
    """Notes for evaluated checkpoints whose training data carries no decontamination record
    (A.4: "We remove any training problem that shares a 13-gram of lower-cased words with"
    the test sets; see ``loopeval decontaminate``)."""
    return [f"{e.where.name}: its training data has no decontamination record in the manifest"
            for e in evals if e.manifest and "decontamination" in e.manifest.get("data", {})
            and not e.manifest["data"]["decontamination"]]


def loop_conversion(evals: list[Evaluation]) -> list[str]:
    """Notes for evaluated checkpoints trained by ``loop-convert`` (paper 004): the
    parameters the recipe added beside the base's, and every exit-gate collapse in
    the recorded exit distribution ("the loss alone does not reveal the collapse")."""
    notes = []
    for e in evals:
        m = e.manifest or {}
        added = (m.get("parameters") or {}).get("added")
        if added:
            notes.append(f"{e.where.name}: recipe {m.get('recipe')} added {added} parameters beside the base's "
                         f"{m['parameters']['base']} (exit gate and mix logit)")
        notes += collapse_notes(m, e.where.name)
    return notes


def draw(curves: list[dict]):
    """Fig. 3 (left): held-out loss of the comparison minus that of the looped model, in
    milli-nats (above zero: the loop is ahead): the twin at equal tokens (blue), the twin at
    equal training compute (red), the looped model's first pass against its second (green).
    Fig. 5 (right): r(D), with 1 (grey) and the loop's training costs (red)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from loopeval.training.exchange import Curve, loss_at

    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    styles = ["-", "--", ":", "-."]
    for i, c in enumerate(curves):
        ls = styles[i % len(styles)]
        twin = Curve(tuple(c["twin"]["tokens"]), tuple(c["twin"]["loss"]))
        d, looped = c["looped"]["tokens"], c["looped"]["loss"]
        left.plot(d, [1000 * (loss_at(twin, x) - y) for x, y in zip(d, looped)], color="#1b6ca8", ls=ls,
                  label=f"twin, equal tokens ({c['label']})")
        equal = c["twin_at_equal_compute"].get("layers")
        if equal:
            left.plot(d, [1000 * (a - y) for a, y in zip(equal["loss"], looped)], color="#d1495b", ls=ls,
                      label=f"twin, equal training compute ({c['label']})")
        by_passes = c["looped_by_passes"]
        if "1" in by_passes and "2" in by_passes:
            left.plot(d, [1000 * (a - b) for a, b in zip(by_passes["1"]["loss"], by_passes["2"]["loss"])],
                      color="#66a182", ls=ls, label=f"looped, pass 1 against pass 2 ({c['label']})")
        ex = c["exchange"]
        right.plot(ex["tokens"], [float("nan") if r is None else r for r in ex["rate"]], color="#1d2733", ls=ls,
                   marker="o", label=f"r(D) ({c['label']})")
        for name, cost in ex["costs"].items():
            right.axhline(cost, color="#d1495b", lw=0.8, ls=":")
            right.annotate(f"{name} {cost:.2f}", (ex["tokens"][0], cost), fontsize="x-small", color="#d1495b")
    left.axhline(0, color="grey", lw=0.8)
    right.axhline(1, color="grey", lw=0.8)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.grid(alpha=0.3)
    left.set_ylabel("held-out loss minus looped (milli-nats)")
    right.set_ylabel("token exchange rate r(D)")
    left.legend(fontsize="x-small", frameon=False)
    return fig
