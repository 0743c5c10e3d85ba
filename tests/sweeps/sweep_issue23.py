"""A fresh bad-input sweep (issue 23's last item): each case prints VERDICT | case | what happened."""
import json, os, shutil, sys, tempfile
from pathlib import Path
import yaml
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
from sweep_common import cli

RUNS = Path("tests/fixtures/runs").resolve()
T = Path(tempfile.mkdtemp())
results = []


def case(name, fn):
    try:
        verdict, detail = fn()
    except BaseException as e:
        verdict, detail = "TRACEBACK", f"{type(e).__name__}: {e}"
    results.append((verdict, name, detail))
    print(f"{verdict} | {name} | {str(detail)[:220]}", flush=True)

def copy(name):
    dst = T / f"{name}_{len(results)}"
    shutil.copytree(RUNS / name, dst)
    return dst

def results_json(run):
    return next(run.rglob("results_*.json"))

# 1 results file with versions a list
def c1():
    run = copy("twin"); f = results_json(run); d = json.loads(f.read_text()); d["versions"] = [1, 2]; f.write_text(json.dumps(d))
    code, err, _ = cli(["compare", str(run), str(RUNS / "looped")])
    return ("REFUSED" if code == 2 else "TRACEBACK" if code == "TRACEBACK" else f"ACCEPTED({code})"), err
case("results file whose 'versions' is a list", c1)

# 2 report --json pointing at an input samples file
def c2():
    run = copy("twin"); s = next(run.rglob("samples_toy_arith_*.jsonl")); before = s.read_bytes()
    code, err, _ = cli(["report", "--twin", str(run), "--looped", str(RUNS / "looped"), "--out", str(T / "r2.html"), "--json", str(s)])
    return ("REFUSED" if code == 2 and s.read_bytes() == before else f"WRONG({code})"), err
case("report --json = an input samples file", c2)

# 3 train --out = the base checkpoint folder with --overwrite
def c3():
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer
    tok = tiny_tokenizer(); save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=2), tok, T / "base3")
    (T / "d3.jsonl").write_text('{"text": "hello world"}\n')
    code, err, _ = cli(["train", "--base", str(T / "base3"), "--data", str(T / "d3.jsonl"), "--out", str(T / "base3"), "--only", "twin", "--overwrite", "--steps", "1"])
    return ("REFUSED" if code == 2 else f"WRONG({code})"), err
case("train --out = the base checkpoint, --overwrite", c3)

# 4 place --out = the --data file
def c4():
    (T / "d4.jsonl").write_text('{"text": "hi"}\n')
    code, err, _ = cli(["place", "--model", str(T / "base3"), "--data", str(T / "d4.jsonl"), "--out", str(T / "d4.jsonl")])
    return ("REFUSED" if code == 2 and (T / "d4.jsonl").read_text() == '{"text": "hi"}\n' else f"WRONG({code})"), err
case("place --out = its --data file", c4)

def study(name, **changes):
    base = {"name": "s", "output": str(T / f"out_{name}"), "tasks": ["tiny_boxed"], "include_path": [str(T / "tasks")],
            "models": [{"name": "twin", "role": "twin", "path": str(T / "base3")},
                       {"name": "looped", "role": "looped", "base": str(T / "base3"), "loop": "0:2x2"}],
            "lm_eval": {"device": "cpu", "batch_size": 2}}
    base.update(changes)
    p = T / f"{name}.yaml"; p.write_text(yaml.safe_dump(base)); return p

def setup_task():
    sys.path.insert(0, "tests")
    from support import write_generate_task
    write_generate_task(T / "tasks", "tiny_boxed", [{"question": "1+1?", "answer": "2"}] * 3, max_gen_toks=16)
setup_task()

def dry(p):
    code, err, out = cli(["protocol", str(p), "--dry-run"])
    return code, err

# 5 study statistics.alpha 1.5
def c5():
    code, err = dry(study("alpha", statistics={"alpha": 1.5}))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study statistics.alpha: 1.5", c5)

# 6 study statistics.margin: 2 (points)
def c6():
    code, err = dry(study("margin", statistics={"margin": 2}))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study statistics.margin: 2 (points, not a fraction)", c6)

# 7 study output: a file
def c7():
    (T / "afile").write_text("x")
    code, err = cli(["protocol", str(study("outfile", output=str(T / "afile")))])[:2]
    return ("REFUSED" if code == 2 else "TRACEBACK" if code == "TRACEBACK" else f"ACCEPTED({code})"), err
case("study output: an existing file", c7)

# 8 study lm_eval.batch_size: 0
def c8():
    code, err = dry(study("bs0", lm_eval={"device": "cpu", "batch_size": 0}))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code}) (dry run)"), err
case("study lm_eval.batch_size: 0", c8)

# 9 study lm_eval.num_fewshot: "five"
def c9():
    code, err = dry(study("fs", lm_eval={"device": "cpu", "num_fewshot": "five"}))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code}) (dry run)"), err
case("study lm_eval.num_fewshot: five", c9)

# 10 study decoding reserve past the budget
def c10():
    code, err = dry(study("res", decoding=[{"name": "bf", "budget_forcing": True, "bf_reserve": 100000}]))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study decoding bf_reserve 100000 on a 16-token task", c10)

# 11 study budgets [1, 1.0]
def c11():
    code, err = dry(study("dupb", budgets=[1, 1.0]))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study budgets: [1, 1.0]", c11)

# 12 study models[0].seed: 1.5
def c12():
    m = [{"name": "twin", "role": "twin", "path": str(T / "base3"), "seed": 1.5},
         {"name": "looped", "role": "looped", "base": str(T / "base3"), "loop": "0:2x2", "seed": 1.5}]
    code, err = dry(study("seed", models=m))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study models[].seed: 1.5", c12)

# 13 study intended_differences: a string
def c13():
    code, err = dry(study("intdiff", intended_differences="prompts"))
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("study intended_differences: 'prompts' (a string)", c13)

# 14 trace header format 3
def c14():
    run = copy("twin"); tr = next(run.rglob("loopeval_trace_*.jsonl")); lines = tr.read_text().splitlines()
    h = json.loads(lines[0]); h["format"] = 3; tr.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
    code, err, _ = cli(["compare", str(run), str(RUNS / "looped")])
    return ("WARNED" if any("format" in e for e in err) or code == 0 else f"?({code})"), err
case("trace header format 3", c14)

# 15 compare --n-resamples 0
def c15():
    code, err, _ = cli(["compare", str(RUNS / "twin"), str(RUNS / "looped"), "--n-resamples", "0"])
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("compare --n-resamples 0", c15)

# 16 report --default-scale 0.7 with no runs at 0.7
def c16():
    code, err, _ = cli(["report", "--twin", str(RUNS / "twin"), "--looped", str(RUNS / "looped"), "--out", str(T / "r16.html"), "--default-scale", "0.7"])
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("report --default-scale 0.7 (no run at 0.7)", c16)

# 17 samples file with a doc_id that is a string "abc"
def c17():
    run = copy("twin"); s = next(run.rglob("samples_toy_arith_*.jsonl")); rows = [json.loads(l) for l in s.read_text().splitlines()]
    rows[0]["doc_id"] = "abc"; s.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err, _ = cli(["compare", str(run), str(RUNS / "looped")])
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("samples doc_id 'abc'", c17)

# 18 resume_dir store file is a folder
def c18():
    d = T / "store18"; (d / "loopeval_responses.jsonl").mkdir(parents=True)
    from loopeval.evaluation.responses import ResponseStore
    try:
        ResponseStore(d); return "ACCEPTED", "no error at open"
    except ValueError as e:
        return "REFUSED", str(e)
case("resume_dir whose loopeval_responses.jsonl is a folder", c18)

# 19 decontaminate --out = --data
def c19():
    (T / "d19.jsonl").write_text('{"text": "x"}\n')
    code, err, _ = cli(["decontaminate", str(T / "d19.jsonl"), "--out", str(T / "d19.jsonl"), "--against", "tiny_boxed", "--include-path", str(T / "tasks")])
    return ("REFUSED" if code == 2 else f"WRONG({code})"), err
case("decontaminate --out = its data", c19)

# 20 power --alpha 0 
def c20():
    code, err, _ = cli(["power", str(RUNS / "twin"), str(RUNS / "looped"), "--alpha", "0"])
    return ("REFUSED" if code == 2 else f"ACCEPTED({code})"), err
case("power --alpha 0", c20)

# 21 results file that is a JSON list
def c21():
    run = copy("twin"); f = results_json(run); f.write_text("[1, 2]")
    code, err, _ = cli(["compare", str(run), str(RUNS / "looped")])
    return ("REFUSED" if code == 2 else "TRACEBACK" if code == "TRACEBACK" else f"ACCEPTED({code})"), err
case("results file holding a JSON list", c21)

# 22 results config.model_args a number
def c22():
    run = copy("twin"); f = results_json(run); d = json.loads(f.read_text()); d["config"]["model_args"] = 7; f.write_text(json.dumps(d))
    code, err, _ = cli(["compare", str(run), str(RUNS / "looped")])
    return ("OK" if code == 0 else "TRACEBACK" if code == "TRACEBACK" else f"?({code})"), err
case("results config.model_args: 7", c22)

print("\nSUMMARY", {v: sum(1 for r in results if r[0] == v) for v in {r[0] for r in results}})
