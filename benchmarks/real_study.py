"""The recorded real study of docs/real-models.md: SmolLM2-135M-Instruct (and Gemma 3 270M)
on real GSM8K, every step a loopeval or lm_eval command, timed.

    python benchmarks/real_study.py --smollm2 "$LOOPEVAL_SMOLLM2_GGUF" \
        --gemma "$LOOPEVAL_GEMMA3_GGUF" --gsm8k grade-school-math/grade_school_math/data --work study

Steps (each skipped when its output exists, so an interrupted study resumes):
import the GGUF files; write real GSM8K as local lm-eval tasks; decontaminate GSM8K
train text against the GSM8K test set; the placement search on it; the unlooped model
and training-free loops at ``--placements`` placements spread over the PPL_T ranking
(best, middle and worst among them) on ``gsm8k_nll`` (``--nll-items`` test questions),
each compared with the unlooped run; Spearman's rho between PPL_T and the NLL;
``gsm8k_boxed`` accuracy of the unlooped model and the best loop (``--acc-items``);
LoRA conversion of the best loop and of its twin (``--convert-steps``), then Δparam on
``gsm8k_nll``; ``serve-cost`` of the best loop; Gemma 3's placement search.

While a file WORK/PAUSE exists, no new command starts. Every command and its wall time
go to WORK/commands.jsonl, written to run anywhere: WORK relative to the current folder,
the GGUF files as ``$LOOPEVAL_SMOLLM2_GGUF`` and ``$LOOPEVAL_GEMMA3_GGUF``; the figures to
WORK/study.json; ``--doc docs/real-models.md`` rewrites the part of that file between
its ``<!-- study -->`` markers from them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scipy.stats import spearmanr

HERE = Path(__file__).resolve().parent
TASKS_DIR = HERE.parent / "tasks"


class Study:
    def __init__(self, work: Path, names: dict[str, str]):
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = work / "commands.jsonl"
        # how a recorded command names this machine's paths: WORK relative, inputs by variable
        self.names = {str(work): os.path.relpath(work), **names}

    def portable(self, cmd: list[str]) -> str:
        text = shlex.join(cmd)
        for path in sorted(self.names, key=len, reverse=True):
            text = text.replace(path, self.names[path])
        return text

    def run(self, step: str, cmd: list[str], done: Path, *, stdout: Path | None = None) -> None:
        """Run ``cmd`` unless ``done`` exists (its standard output also to ``stdout``); record
        its wall time under ``step``. For an lm_eval run, ``done`` is its output folder, done
        once it holds a results file."""
        if done.exists() and (done.is_file() or "lm_eval" not in cmd or any(done.rglob("results_*.json"))):
            print(f"[{step}] done already: {done}", flush=True)
            return
        if "lm_eval" in cmd and done.exists():
            shutil.rmtree(done)  # what an interrupted run left
        while (self.work / "PAUSE").exists():  # room for measurements that need the machine to themselves
            time.sleep(5)
        print(f"[{step}] {shlex.join(cmd)}", flush=True)
        start = time.time()
        if stdout is None:
            subprocess.run(cmd, check=True)
        else:
            text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            print(text, flush=True)
            stdout.write_text(text)
        wall = time.time() - start
        with self.log.open("a") as f:
            f.write(json.dumps({"step": step, "command": self.portable(cmd), "wall_s": round(wall, 1),
                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        print(f"[{step}] {wall:.0f} s", flush=True)

    def commands(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


def lm_eval(model: str, args: str, tasks: str, out: Path, local_tasks: Path, limit: int, batch: int,
            *, generate: bool = False) -> list[str]:
    cmd = ["lm_eval", "--model", "looped", "--model_args", f"pretrained={model},{args}trace={out}",
           "--tasks", tasks, "--include_path", str(local_tasks), "--apply_chat_template",
           "--log_samples", "--output_path", str(out), "--limit", str(limit), "--batch_size", str(batch)]
    return cmd


def compare(study: Study, base: Path, cand: Path, out: Path, *extra: str) -> dict:
    if not out.exists():
        cmd = ["loopeval", "compare", "--json", "--allow-subset", *extra, str(base), str(cand)]
        start = time.time()
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        out.write_text(text)
        with study.log.open("a") as f:
            f.write(json.dumps({"step": f"compare {out.stem}", "command": study.portable(cmd),
                                "wall_s": round(time.time() - start, 1)}) + "\n")
    return json.loads(out.read_text())


def spread(rows: list[dict], k: int) -> list[dict]:
    """``k`` rows evenly spaced over a ranked list, first and last included."""
    if len(rows) <= k:
        return rows
    idx = sorted({round(i * (len(rows) - 1) / (k - 1)) for i in range(k)})
    return [rows[i] for i in idx]


def loop_args(row: dict) -> str:
    return f"loop={row['loop']},loop_operator={row['operator']},loop_beta={row['beta']},"


def _cmp_row(name: str, res: dict, task: str) -> str:
    """One ``compare --json`` row in the metric's unit (``compare --json`` stores fractions: a 0/1
    accuracy is shown in points, the NLL in nats per byte, lower is better): Δ is candidate minus
    baseline; the verdict says which is better."""
    from loopeval.evaluation.metrics import POINTS, OWN_UNITS

    t = res["tasks"][task]
    unit = POINTS if t["unit"] == "fraction" else next(u for u in OWN_UNITS.values() if u.name == t["unit"])
    lo, hi = t["ci"]
    p = t["mcnemar_pvalue"] if t["decided_by"] == "mcnemar" else t["pvalue"]  # the p of the deciding test
    return (f"| {name} | {unit.name} | {t['n']} | {unit.show(t['baseline'])} | {unit.show(t['candidate'])} | "
            f"{unit.show(t['delta'], signed=True)} | [{unit.show(lo, signed=True)}, {unit.show(hi, signed=True)}] | "
            f"{p:.3g} ({t['decided_by']}) | {t['outcome']} |")


CMP_HEADER = ("| comparison | unit | n | baseline | candidate | Δ (candidate − baseline) | 95% CI | p | verdict |\n"
              "|---|---|---:|---:|---:|---:|---|---:|---|")


def profile_figure(placements: list[dict], path: Path, title: str) -> None:
    """PPL_T of every window by its start, one line per width (the location profile)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r for r in placements if not r.get("loop"))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for width in sorted({r["width"] for r in placements if r.get("loop")}):
        rows = sorted((r for r in placements if r.get("loop") and r["width"] == width), key=lambda r: r["start"])
        ax.plot([r["start"] for r in rows], [r["ppl_t"] for r in rows], marker="o", ms=3, label=f"width {width}")
    ax.axhline(base["ppl_t"], color="black", lw=0.8, ls="--", label="unlooped")
    ax.set_yscale("log")
    ax.set_xlabel("window start (layer)")
    ax.set_ylabel("PPL_T (log scale)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def render(f: dict, figure: str) -> str:
    """The study's figures as markdown (the block between the doc's markers)."""
    out = ["### Commands and wall times", "", "| step | wall | command |", "|---|---:|---|"]
    out += [f"| {c['step']} | {c['wall_s']:.0f} s | `{c['command']}` |" for c in f["commands"]]
    base = next(r for r in f["placements"] if not r.get("loop"))
    loops = sorted((r for r in f["placements"] if r.get("loop")), key=lambda r: r["ppl_t"])
    out += ["", f"### Placement ({len(loops)} windows, damped β = 0)", "",
            f"Unlooped: PPL {base['ppl']:.3f}, PPL_T {base['ppl_t']:.3f} (T* = {base['temperature']:.3f}) on "
            f"{base['tokens']} test tokens.", "", f"![location profile]({figure})", "",
            "| rank | loop | PPL_T | PPL_T / unlooped, 95% CI | PPL | KL | c |", "|---:|---|---:|---|---:|---:|---:|"]
    shown = loops[:10] + [r for r in loops[10:] if r in f["chosen"]] + loops[-3:]
    seen = set()
    for r in shown:
        if r["loop"] in seen:
            continue
        seen.add(r["loop"])
        lo, hi = r["ratio_ci"]
        out.append(f"| {loops.index(r) + 1} | {r['loop']} | {r['ppl_t']:.3f} | {r['ppl_t'] / base['ppl_t']:.4f} "
                   f"[{lo:.4f}, {hi:.4f}] | {r['ppl']:.3f} | {r['kl']:.4f} | {r['multiplier']:.3f} |")
    named = {v: k for k, v in f["named"].items()}
    first = f["nll"][f["chosen"][0]["loop"]]["tasks"]["gsm8k_nll"]
    out += ["", "### Training-free loops against the unlooped model on gsm8k_nll", "",
            f"NLL per byte of the reference solution (lower is better); unlooped: **{first['baseline']:.4f}** on "
            f"{first['n']} questions. Δ is the loop's NLL minus the unlooped one's (negative: the loop is better), "
            "with its paired-bootstrap 95% interval and p.", "",
            "| loop | PPL_T rank | PPL_T | c | NLL per byte | Δ | 95% CI | p | verdict |",
            "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in f["chosen"]:
        t = f["nll"][r["loop"]]["tasks"]["gsm8k_nll"]
        lo, hi = t["ci"]
        label = f"{r['loop']}" + (f" ({named[r['loop']]})" if r["loop"] in named else "")
        out.append(f"| {label} | {loops.index(r) + 1} | {r['ppl_t']:.3f} | {r['multiplier']:.3f} | "
                   f"{t['candidate']:.4f} | {t['delta']:+.4f} | [{lo:+.4f}, {hi:+.4f}] | {t['pvalue']:.3g} | "
                   f"{t['outcome']} |")
    sp = f["spearman"]
    out += ["", f"Spearman's ρ between PPL_T and mean NLL per byte over the {sp['n']} placements: "
            f"**{sp['rho']:.3f}** (p = {sp['pvalue']:.3g}).", ""]
    if "acc" in f:
        out += ["### GSM8K accuracy (gsm8k_boxed, budget forcing on both sides)", "", CMP_HEADER,
                _cmp_row(f"unlooped vs {f['named']['best']}", f["acc"], "gsm8k_boxed"), ""]
    if "convert" in f:
        m = f["convert"]["manifests"]
        out += ["### LoRA conversion of the best loop and its twin (`--recipe convert`)", "",
                "| side | steps | train time | final loss |", "|---|---:|---:|---:|"]
        for side in ("twin", "looped"):
            curve = m[side].get("loss_curve") or [[0, float("nan")]]
            out.append(f"| {side} | {m[side].get('steps_done', m[side].get('config', {}).get('steps'))} | "
                       f"{m[side].get('train_time_s', float('nan')):.0f} s | {curve[-1][1]:.4f} |")
        out += ["", CMP_HEADER, _cmp_row("Δparam: twin vs looped", f["convert"]["dparam"], "gsm8k_nll"),
                _cmp_row("unlooped vs converted twin", f["convert"]["twin_vs_base"], "gsm8k_nll"), ""]
    if "serve" in f:
        out += ["### serve-cost of the best loop", "", "```", f["serve"].strip(), "```", ""]
    if "gemma_placements" in f:
        g = f["gemma_placements"]
        gb = next(r for r in g if not r.get("loop"))
        out += ["### Gemma 3 270M placement", "", f"Unlooped PPL_T {gb['ppl_t']:.3f} on {gb['tokens']} test tokens.", "",
                "| loop | PPL_T | ratio, 95% CI | KL |", "|---|---:|---|---:|"]
        for r in sorted((r for r in g if r.get("loop")), key=lambda r: r["ppl_t"]):
            lo, hi = r["ratio_ci"]
            out.append(f"| {r['loop']} | {r['ppl_t']:.3f} | {r['ppl_t'] / gb['ppl_t']:.4f} [{lo:.4f}, {hi:.4f}] | "
                       f"{r['kl']:.4f} |")
    return "\n".join(out) + "\n"


def write_doc(doc: Path, block: str) -> None:
    text = doc.read_text()
    begin, end = "<!-- study -->", "<!-- /study -->"
    if begin not in text or end not in text:
        raise SystemExit(f"{doc}: no {begin} ... {end} block to rewrite")
    head, rest = text.split(begin, 1)
    doc.write_text(head + begin + "\n" + block + end + rest.split(end, 1)[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", required=True, help="SmolLM2-135M-Instruct GGUF file")
    p.add_argument("--gemma", help="Gemma 3 270M GGUF file (optional)")
    p.add_argument("--gsm8k", required=True, help="folder with GSM8K test.jsonl and train.jsonl")
    p.add_argument("--work", required=True)
    p.add_argument("--widths", default="2,4,8")
    p.add_argument("--times", default="2")
    p.add_argument("--betas", default="0")
    p.add_argument("--place-tokens", type=int, default=4096)
    p.add_argument("--placements", type=int, default=8, help="loops evaluated on gsm8k_nll (>= 3)")
    p.add_argument("--nll-items", type=int, default=200)
    p.add_argument("--acc-items", type=int, default=24)
    p.add_argument("--budget-scale", default="0.25")
    p.add_argument("--convert-steps", type=int, default=40)
    p.add_argument("--convert-batch", type=int, default=8)
    p.add_argument("--gemma-starts", default="2,4,6,8,10,12")
    p.add_argument("--skip", default="", help="comma-separated steps to leave out: acc,convert,serve,gemma")
    p.add_argument("--doc", help="markdown file whose <!-- study --> block to rewrite")
    a = p.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    w = Path(a.work).resolve()
    study = Study(w, {a.smollm2: "$LOOPEVAL_SMOLLM2_GGUF", **({a.gemma: "$LOOPEVAL_GEMMA3_GGUF"} if a.gemma else {})})
    model = w / "smollm2"

    study.run("import-gguf", ["loopeval", "import-gguf", a.smollm2, "--out", str(model)], model / "config.json")

    data = w / "data" / "gsm8k" / "main"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(a.gsm8k) / "test.jsonl", data / "test.jsonl")
    local = w / "local_tasks"
    study.run("local-tasks", ["loopeval", "local-tasks", "--data", str(w / "data"), "--out", str(local),
                              "--tasks", "gsm8k_boxed,gsm8k_nll"], local)
    text = w / "gsm8k_train_text.jsonl"
    if not text.exists():
        rows = [json.loads(line) for line in (Path(a.gsm8k) / "train.jsonl").read_text().splitlines()]
        text.write_text("".join(json.dumps({"text": r["question"] + "\n" + r["answer"]}) + "\n" for r in rows))
    clean = w / "gsm8k_train_clean.jsonl"
    study.run("decontaminate", ["loopeval", "decontaminate", str(text), "--against", "gsm8k_boxed",
                                "--include-path", str(local), "--out", str(clean)], clean)

    place = w / "place"
    study.run("place", ["loopeval", "place", "--model", str(model), "--data", str(clean), "--out", str(place),
                        "--widths", a.widths, "--times", a.times, "--betas", a.betas,
                        "--max-tokens", str(a.place_tokens), "--seq-len", "1024", "--batch-tokens", "4096"],
              place / "placement.html")
    placements = [json.loads(line) for line in (place / "placements.jsonl").read_text().splitlines()]
    loops = sorted((r for r in placements if r.get("loop")), key=lambda r: r["ppl_t"])
    chosen = spread(loops, a.placements)

    runs = w / "runs"
    base_nll = runs / "nll" / "base"
    study.run("nll base", lm_eval(str(model), "", "gsm8k_nll", base_nll, local, a.nll_items, 16), base_nll)
    nll = {}
    for row in chosen:
        out = runs / "nll" / row["loop"].replace(":", "_")
        study.run(f"nll {row['loop']}", lm_eval(str(model), loop_args(row), "gsm8k_nll", out, local, a.nll_items, 16),
                  out)
        nll[row["loop"]] = compare(study, base_nll, out, out.with_suffix(".compare.json"))
    named = {"best": chosen[0], "middle": chosen[len(chosen) // 2], "worst": chosen[-1]}

    # compare --json reports the NLL per byte as lm-eval does (lower is better)
    rho = spearmanr([r["ppl_t"] for r in chosen],
                    [nll[r["loop"]]["tasks"]["gsm8k_nll"]["candidate"] for r in chosen])
    figures = {"placements": placements, "chosen": chosen, "named": {k: v["loop"] for k, v in named.items()},
               "nll": nll, "spearman": {"rho": rho.statistic, "pvalue": rho.pvalue, "n": len(chosen)}}

    best = named["best"]
    if "acc" not in skip:
        gen = f"budget_forcing=true,budget_scale={a.budget_scale},"
        acc = {}
        for name, args in (("base", ""), ("best", loop_args(best))):
            out = runs / "acc" / name
            study.run(f"acc {name}", lm_eval(str(model), gen + args, "gsm8k_boxed", out, local, a.acc_items, 8),
                      out)
        figures["acc"] = compare(study, runs / "acc" / "base", runs / "acc" / "best",
                                 runs / "acc" / "best.compare.json", "--test", "mcnemar")

    if "convert" not in skip:
        conv = w / "convert"
        study.run("convert", ["loopeval", "train", "--base", str(model), "--data", str(clean), "--loop", best["loop"],
                              "--operator", best["operator"], "--beta", str(best["beta"]), "--recipe", "convert",
                              "--steps", str(a.convert_steps), "--batch-size", str(a.convert_batch),
                              "--max-length", "256", "--log-every", "5", "--out", str(conv)],
                  conv / "looped" / "training_manifest.json")
        for side in ("twin", "looped"):
            out = runs / "nll" / f"convert_{side}"
            study.run(f"nll convert {side}", lm_eval(str(conv / side), "", "gsm8k_nll", out, local, a.nll_items, 16),
                      out)
        figures["convert"] = {
            "dparam": compare(study, runs / "nll" / "convert_twin", runs / "nll" / "convert_looped",
                              runs / "nll" / "convert_dparam.compare.json"),
            "twin_vs_base": compare(study, base_nll, runs / "nll" / "convert_twin",
                                    runs / "nll" / "convert_twin.compare.json"),
            "manifests": {s: json.loads((conv / s / "training_manifest.json").read_text()) for s in ("twin", "looped")},
        }

    if "serve" not in skip:
        serve = w / "serve"
        study.run("serve-cost", ["loopeval", "serve-cost", "--model", str(model), "--loop", best["loop"],
                                 "--operator", best["operator"], "--beta", str(best["beta"]),
                                 "--prompt-tokens", "256", "--new-tokens", "64", "--batch-sizes", "1,8",
                                 "--repeats", "3", "--out", str(serve)], serve / "serve_cost.json",
                  stdout=w / "serve_cost.txt")
        figures["serve"] = (w / "serve_cost.txt").read_text()

    if a.gemma and "gemma" not in skip:
        gemma = w / "gemma3"
        study.run("gemma import-gguf", ["loopeval", "import-gguf", a.gemma, "--out", str(gemma)], gemma / "config.json")
        gplace = w / "gemma_place"
        study.run("gemma place", ["loopeval", "place", "--model", str(gemma), "--data", str(clean), "--out", str(gplace),
                                  "--widths", "2,4", "--times", "2", "--betas", "0", "--starts", a.gemma_starts,
                                  "--max-tokens", "2048", "--seq-len", "512", "--batch-tokens", "2048"],
                  gplace / "placement.html")
        figures["gemma_placements"] = [json.loads(line) for line in (gplace / "placements.jsonl").read_text().splitlines()]

    figures["commands"] = study.commands()
    (w / "study.json").write_text(json.dumps(figures, indent=1, default=str))
    print(f"figures: {w / 'study.json'}")
    if a.doc:
        doc = Path(a.doc)
        figure = doc.parent / "figures" / "real_placement_profile.png"
        profile_figure(placements, figure, f"SmolLM2-135M-Instruct: {len(loops)} windows on GSM8K train text")
        write_doc(doc, render(figures, figure.relative_to(doc.parent).as_posix()))
        print(f"rewrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
