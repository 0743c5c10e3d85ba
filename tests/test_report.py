"""`loopeval demo` end to end (reduced size), the report's numbers, its bad input, and the
report rendered in headless Chromium."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loopeval.report import build_report, render
from loopeval.stats import paired_bootstrap, tost


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "loopeval", "demo", "--size", "tiny", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out, proc.stdout


def _runs(out: Path, prefix: str) -> list[Path]:
    return sorted(p for p in (out / "runs").iterdir() if p.name.startswith(prefix))


def _item_acc(run: Path) -> np.ndarray:
    """Per-item accuracy read straight from lm-eval's samples file, ordered by doc_id."""
    (file,) = run.rglob("samples_*.jsonl")
    rows = sorted((json.loads(line) for line in file.read_text().splitlines()), key=lambda r: r["doc_id"])
    return np.array([r["acc"] for r in rows], dtype=float)


def test_demo_writes_every_stage(demo):
    out, stdout = demo
    assert (out / "report.html").is_file()
    assert len(list((out / "runs").iterdir())) == 16
    assert (out / "checkpoints" / "twin" / "training_manifest.json").is_file()
    assert json.loads((out / "checkpoints" / "looped" / "loop_config.json").read_text())["loop"] == "2:4x2"
    train = {json.loads(line)["prompt"] for line in (out / "data" / "train.jsonl").read_text().splitlines()}
    test = [json.loads(line)["question"] for line in (out / "data" / "test.jsonl").read_text().splitlines()]
    assert not any(q in p for q in test for p in train)  # decontaminated
    assert "5/5" in stdout and f"open {out / 'report.html'}" in stdout
    assert "fatal:" not in stdout


def test_report_numbers_equal_loopeval_stats(demo):
    out, _ = demo
    data = build_report(_runs(out, "looped_"), _runs(out, "twin_"))
    plain = next(c for c in data.conditions if not c["forcing"])
    twin = _item_acc(out / "runs" / "twin_plain_1x")
    looped = _item_acc(out / "runs" / "looped_plain_1x")
    expected = paired_bootstrap({"arith_boxed": twin}, {"arith_boxed": looped})
    m = plain["param"].macro
    assert m.delta == pytest.approx(looped.mean() - twin.mean())
    assert (m.ci.low, m.ci.high, m.pvalue) == pytest.approx((expected.ci.low, expected.ci.high, expected.pvalue))
    eq = tost({"arith_boxed": twin}, {"arith_boxed": looped})
    assert plain["param"].tasks["arith_boxed"].equivalence_ci == pytest.approx(tuple(eq.ci))
    row = next(r for r in data.decoding if r["setting"] == "looped")
    assert row["macro"] == pytest.approx(looped.mean())
    # the rendered HTML shows the same numbers, in points
    html = render(data)
    assert f"{100 * twin.mean():.1f} → " in html
    assert all(c.ok for c in data.checks), [c for c in data.checks if not c.ok]


def test_missing_twin_and_mismatched_tasks_name_the_run(demo, tmp_path):
    out, _ = demo
    twins = [p for p in _runs(out, "twin_") if p.name != "twin_plain_1x"]
    with pytest.raises(ValueError, match=r"missing twin run at the default budget \(1×, plain decoding\).*looped_plain"):
        build_report(_runs(out, "looped_"), twins)
    with pytest.raises(ValueError, match="given as unlooped but its trace records a loop"):
        build_report(_runs(out, "looped_"), _runs(out, "looped_"))
    other = tmp_path / "other_task"
    shutil.copytree(out / "runs" / "twin_plain_1x", other)
    for file in other.rglob("*.json*"):
        file.write_text(file.read_text().replace("arith_boxed", "other_boxed"))
    for file in other.rglob("samples_arith_boxed_*"):
        file.rename(file.with_name(file.name.replace("arith_boxed", "other_boxed")))
    with pytest.raises(ValueError, match="runs cover different tasks.*other_task: other_boxed"):
        build_report(_runs(out, "looped_"), [*twins, other])


def _with_setting(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    (trace,) = dst.glob("loopeval_trace_*.jsonl")
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    header["settings"].update(changes)
    trace.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return dst


def test_different_decoding_settings_warn_or_fail_with_strict(demo, tmp_path):
    out, _ = demo
    twins = [p for p in _runs(out, "twin_") if p.name != "twin_plain_1x"]
    twins.append(_with_setting(out / "runs" / "twin_plain_1x", tmp_path / "twin_plain_1x", dtype="bfloat16"))
    with pytest.warns(UserWarning, match="fairness check failed"):
        data = build_report(_runs(out, "looped_"), twins)
    html = render(data)
    assert 'id="failed-checks"' in html
    assert html.index('id="failed-checks"') < html.index('id="table-param"')  # shown first, not hidden
    assert "dtype: &#39;float32&#39; vs &#39;bfloat16&#39;" in html  # autoescaped
    cli = subprocess.run(
        [sys.executable, "-m", "loopeval", "report", "--strict", "--out", str(tmp_path / "r.html"),
         "--looped", *map(str, _runs(out, "looped_")), "--twin", *map(str, twins)],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 2 and "fairness check failed" in cli.stderr and "dtype" in cli.stderr


def test_custom_template(demo, tmp_path):
    out, _ = demo
    data = build_report(_runs(out, "looped_"), _runs(out, "twin_"), n_resamples=500, title="<script>x</script>")
    template = tmp_path / "mine.md.j2"
    template.write_text("{{ data.title }}\n{% for c in data.conditions %}{{ c.label }}: {{ c.param.macro.delta|signed }}\n{% endfor %}")
    lines = render(data, template).splitlines()
    assert lines[0] == "&lt;script&gt;x&lt;/script&gt;"  # autoescaped
    delta = data.conditions[0]["param"].macro.delta
    assert lines[1] == f"plain decoding: {100 * delta:+.1f}"
    assert json.loads(data.to_json())["conditions"][0]["param"]["macro"]["delta"] == pytest.approx(delta)


def test_report_in_headless_chromium(demo, tmp_path):
    """The report as a browser sees it: every table and the figure are in the DOM."""
    out, _ = demo
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed for this test (.ci/run installs it)"
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = (out / "report.html").resolve().as_uri()
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    for table in ("table-param", "table-flop", "table-benchmarks", "table-decoding", "table-runs"):
        assert f'id="{table}"' in dom
    assert dom.count("<circle") == 16  # 4 curves x 4 budgets
    assert dom.count('class="series"') == 4
    assert "Equal parameters:" in dom and "Equal FLOPs:" in dom
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, "--window-size=1200,2400", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000


def test_compare_warns_when_the_runs_decode_differently(demo):
    from loopeval.runs import decoding_differences, load_run

    out, _ = demo
    runs = out / "runs"
    assert decoding_differences(load_run(runs / "twin_plain_1x"), load_run(runs / "looped_plain_1x")) == []
    diffs = decoding_differences(load_run(runs / "twin_plain_1x"), load_run(runs / "looped_bf_2x"))
    assert diffs[0] == "budget_forcing: False vs True"
    assert any(d.startswith("budget_scale: 1.0 vs 2.0") for d in diffs)
    cli = subprocess.run(
        [sys.executable, "-m", "loopeval", "compare", str(runs / "twin_plain_1x"), str(runs / "looped_bf_2x")],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 0 and "warning: the runs decode differently: budget_forcing: False vs True" in cli.stderr
