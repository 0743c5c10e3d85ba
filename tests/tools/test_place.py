"""``loopeval place``: PPL_T against an independent recomputation, prefix reuse against
full forwards, the layer-pass count against its formula, resume, and bad input."""

import json
import math
import re

import numpy as np
import pytest
import torch

from loopeval import apply_loop, remove_loop
from loopeval.tools.placement import build_grid, place, planned_passes, read_placements
from loopeval.tools.placement.engine import NaiveEngine, PrefixEngine
from loopeval.tools.placement.grid import Candidate, mlp_loop_candidates
from loopeval.tools.placement.noise import ppl_interval
from loopeval.tools.placement.text import load_text
from loopeval.tools.tiny import tiny_model

VOCAB = 128


def word_tokenizer():
    """Token ``i`` is the word ``t{i}``: text and ids map to each other exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t2", pad_token="t0")


def model_of(arch="qwen3", layers=6):
    """A tiny random model made confident (head x 8), so its temperature matters."""
    model = tiny_model(arch, vocab_size=VOCAB, num_layers=layers)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Documents sampled from the unlooped model at temperature 0.7: sharper than the
    model, so its fitted temperature lies inside the bounds, and loops move it."""
    model = model_of()
    torch.manual_seed(0)
    with torch.no_grad():
        ids = model.generate(torch.randint(3, VOCAB, (16, 1)), do_sample=True, temperature=0.7, top_k=0, top_p=1.0,
                             max_new_tokens=32, min_new_tokens=32, pad_token_id=0)
    path = tmp_path_factory.mktemp("text") / "text.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(f"t{i}" for i in row.tolist())}) + "\n" for row in ids))
    return path


SMALL = dict(widths=[2, 3], times=[2, 3], betas=[0.0, 0.5], seq_len=16, batch_tokens=320, progress=False)


# -- against an independent recomputation --------------------------------------------


def _nll(logits, ids, labels, temperature=1.0):
    """Mean NLL of each scored next token (labels != -100), and the log-probabilities."""
    logp = torch.log_softmax(logits[:, :-1].double() / temperature, -1)
    mask = labels[:, 1:] != -100
    return -logp.gather(-1, ids[:, 1:, None])[..., 0][mask].mean(), logp[mask]


def _brute_force_temperature(logits, ids, labels):
    """argmin of the validation NLL over a log-spaced grid on [0.05, 20], refined by a
    second grid between the first one's neighbours (spacing 2e-5 relative)."""
    mask = labels[:, 1:] != -100
    z, y = logits[:, :-1][mask].double(), ids[:, 1:][mask]

    def nll(temps):
        t = torch.as_tensor(temps)[:, None, None]
        return (torch.logsumexp(z / t, -1) - z.gather(-1, y[:, None])[:, 0] / t[..., 0]).mean(-1).numpy()

    coarse = np.geomspace(0.05, 20, 1201)
    i = int(np.argmin(nll(coarse)))
    fine = np.geomspace(coarse[max(i - 1, 0)], coarse[min(i + 1, len(coarse) - 1)], 501)
    return float(fine[int(np.argmin(nll(fine)))])


def test_ppl_t_matches_plain_forwards_and_a_brute_force_temperature_grid(text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    result = place(model, text, tokenizer=tok, out=tmp_path, starts=[0, 2, 3], mlp_loop=2, **SMALL)
    rows = {r.key: r for r in result.rows}
    data = load_text(text, tok, seq_len=16)
    checked = [result.unlooped, *result.ranked()[:2], result.ranked()[-1]]
    checked += [r for r in result.rows if r.mlp_loop and r not in checked][:1]
    base_logp = None
    for row in checked:
        with torch.no_grad():
            if row.loop is not None:
                apply_loop(model, row.loop, operator=row.operator, beta=row.beta)
            val = model(data.val.ids).logits
            test = model(data.test.ids).logits
            remove_loop(model)
        best = _brute_force_temperature(val, data.val.ids, data.val.labels)
        nll, logp = _nll(test, data.test.ids, data.test.labels)
        if row.loop is None:
            base_logp = logp
        kl = float((base_logp.exp() * (base_logp - logp)).sum(-1).mean())
        got = rows[row.key]
        assert 0.2 < best < 5  # inside the bounds: the fit is tested, not the clamp
        assert got.temperature == pytest.approx(best, rel=5e-5)
        assert got.ppl == pytest.approx(math.exp(nll), rel=1e-6)
        assert got.ppl_t == pytest.approx(math.exp(_nll(test, data.test.ids, data.test.labels, best)[0]), rel=1e-5)
        assert got.kl == pytest.approx(kl, rel=1e-5, abs=1e-9)
        assert got.tokens == int((data.test.labels != -100).sum())
        # the interval from per-document NLLs of the plain forward, attributed by hand
        logp_t = torch.log_softmax(test[:, :-1].double() / got.temperature, -1)
        token_nll = -logp_t.gather(-1, data.test.ids[:, 1:, None])[..., 0]
        scored = data.test.labels[:, 1:] != -100
        owner = data.test.docs[:, 1:]
        doc_nll = [float(token_nll[scored & (owner == i)].sum()) for i in range(data.test.documents)]
        doc_tokens = [int((scored & (owner == i)).sum()) for i in range(data.test.documents)]
        if row.loop is None:
            base_doc_nll = doc_nll
        expected = ppl_interval(doc_nll, doc_tokens, base_doc_nll)
        assert got.ppl_t_ci == pytest.approx(list(expected.confidence_interval), rel=1e-6)
        assert got.ratio_ci == pytest.approx(list(expected.ratio_interval), rel=1e-6)
        assert got.ppl_t_ci[0] <= got.ppl_t <= got.ppl_t_ci[1] and got.test_documents == data.test.documents
    assert result.unlooped.kl == 0
    assert len({r.ppl_t for r in checked}) == len(checked)  # the loops do change the scores


def test_split_balances_tokens_whole_documents_and_ignores_file_order(tmp_path):
    """Messy lengths (1 to 300 tokens, a few long documents): each document lands whole in
    one part, the validation share is within max(f, 1 - f) x the longest document of
    val_fraction, and reversing the file changes nothing."""
    tok = word_tokenizer()
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in rng.integers(1, 40, size=30)] + [300, 250, 5]
    docs = [" ".join(f"t{int(i)}" for i in rng.integers(3, VOCAB, size=n)) for n in lengths]
    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    for fraction in (0.5, 0.3):
        data = load_text(path, tok, seq_len=16, val_fraction=fraction)
        stream = {name: [int((part.docs == i).sum()) for i in range(part.documents)]
                  for name, part in (("val", data.val), ("test", data.test))}
        sizes = [len(ids) + 1 for ids in tok(docs)["input_ids"]]  # with EOS
        assert sorted(stream["val"] + stream["test"]) == sorted(sizes)  # whole documents
        val, total = sum(stream["val"]), sum(sizes)
        assert abs(val - fraction * total) <= max(fraction, 1 - fraction) * max(sizes)
        reversed_path = tmp_path / "reversed.jsonl"
        reversed_path.write_text("".join(json.dumps({"text": d}) + "\n" for d in reversed(docs)))
        again = load_text(reversed_path, tok, seq_len=16, val_fraction=fraction)
        assert sorted(again.val.ids.flatten().tolist()) == sorted(data.val.ids.flatten().tolist())


# -- prefix reuse -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5", "llama"])
def test_prefix_reuse_equals_full_forwards(arch, text):
    """Every candidate's final hidden states, from its window's start, against a full
    forward of apply_loop's looped model (stacked suffixes, shared iterates)."""
    model, tok = model_of(arch), word_tokenizer()
    data = load_text(text, tok, seq_len=16)
    grid = build_grid(6, widths=[1, 3], times=[2, 4], betas=[0.0, 0.25])
    candidates = grid + mlp_loop_candidates(grid[:3])
    ids = data.test.ids[:3]
    fast, slow = PrefixEngine(model, batch_tokens=160), NaiveEngine(model, batch_tokens=160)  # suffixes stack 3
    with torch.no_grad():
        fast.unlooped(0, ids)
        for e in sorted({c.end for c in candidates if not c.mlp_loop}):
            for group, finals in fast.round(0, ids, [c for c in candidates if c.end == e and not c.mlp_loop]):
                for c, final in zip(group, finals):
                    (_, expected), = slow.round(0, ids, [c])
                    torch.testing.assert_close(final, expected[0], rtol=0, atol=1e-5)
        for group, finals in fast.round(0, ids, [c for c in candidates if c.mlp_loop]):
            (_, expected), = slow.round(0, ids, group)
            torch.testing.assert_close(finals[0], expected[0], rtol=0, atol=1e-5)


def test_prefix_search_equals_naive_search(text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    options = dict(tokenizer=tok, starts=[1, 3], mlp_loop=1, **SMALL)
    fast = place(model, text, out=tmp_path / "fast", **options)
    slow = place(model, text, out=tmp_path / "slow", reuse=False, **options)
    assert [r.key for r in fast.rows] == [r.key for r in slow.rows]
    for a, b in zip(fast.rows, slow.rows):
        for name in ("ppl", "ppl_t", "temperature", "kl"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-5, abs=1e-5)


# -- layer passes -------------------------------------------------------------------


@pytest.mark.parametrize("reuse", [True, False])
def test_executed_layer_passes_equal_the_formula(reuse, text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    options = {**SMALL, "times": [2, 4], "starts": [0, 2, 3]}
    result = place(model, text, tokenizer=tok, out=tmp_path, reuse=reuse, mlp_loop=2, **options)
    grid = build_grid(6, widths=options["widths"], times=options["times"], betas=options["betas"],
                      starts=options["starts"])
    mlp = [r for r in result.rows if r.mlp_loop]
    candidates = grid + [Candidate(r.start, r.width, r.times, r.operator, r.beta, True) for r in mlp]
    assert result.layer_passes == pytest.approx(planned_passes(candidates, 6, reuse=reuse, text_rows=result.text["rows"]))


def test_rounds_bounded_by_fit_memory_follow_the_formula(text, tmp_path):
    """A small ``fit_memory`` splits each window end into several rounds (never a window),
    each paying its own prefix; the executed count still equals the formula."""
    model, tok = model_of(), word_tokenizer()
    data = load_text(text, tok, seq_len=16)
    per_candidate = data.val.tokens * 64 * 4  # hidden 64, float32
    options = {**SMALL, "times": [2], "starts": [1, 2, 3]}
    result = place(model, text, tokenizer=tok, out=tmp_path, fit_memory=3 * per_candidate, **options)
    grid = build_grid(6, widths=options["widths"], times=options["times"], betas=options["betas"], starts=[1, 2, 3])
    rows = result.text["rows"]
    assert result.layer_passes == pytest.approx(planned_passes(grid, 6, text_rows=rows, max_candidates=3))
    assert planned_passes(grid, 6, text_rows=rows, max_candidates=3) > planned_passes(grid, 6, text_rows=rows)


def test_progress_counts_whole_candidates(text, tmp_path, capsys):
    """The bar counts candidates written, never a fraction of one, over several rounds."""
    model, tok = model_of(), word_tokenizer()
    per_candidate = load_text(text, tok, seq_len=16).val.tokens * 64 * 4
    options = {**SMALL, "times": [2], "starts": [1, 2, 3], "progress": True}
    result = place(model, text, tokenizer=tok, out=tmp_path, fit_memory=3 * per_candidate, **options)
    frames = re.findall(r"\| *([^ |]+)/([^ |]+) \[", capsys.readouterr().err)
    assert frames and all(n.isdigit() and total.isdigit() for n, total in frames), frames
    assert frames[-1] == (str(len(result.rows)),) * 2


@pytest.mark.parametrize("layers, floor, ours", [(16, 0.78, 0.35), (36, 0.66, 0.42)])
def test_prefix_reuse_beats_the_floor_on_the_default_grid(layers, floor, ours):
    """The issue's floor: prefix reuse alone runs (N - s) + m passes per candidate instead
    of N + m, 0.78x the naive count at 16 layers and 0.66x at 36. Taking each window's
    first pass from the prefix and sharing the damped chains across beta goes further
    (the ratios docs/placement.md states, for 64 rows of text)."""
    grid = build_grid(layers)
    naive = planned_passes(grid, layers, reuse=False)
    prefix_alone = layers + sum((layers - c.start) + c.spec.extra_passes for c in grid)
    assert round(prefix_alone / naive, 2) == floor
    assert round(planned_passes(grid, layers, text_rows=64) / naive, 2) == ours
    if layers == 36:
        assert len(grid) == 2016  # paper D.1


# -- resume, output -----------------------------------------------------------------


def test_resume_after_a_kill_gives_the_same_table(text, tmp_path, monkeypatch):
    from loopeval.tools.placement import search
    from loopeval.tools.placement.report import format_table

    model, tok = model_of(), word_tokenizer()
    whole = place(model, text, tokenizer=tok, out=tmp_path / "whole", mlp_loop=2, **SMALL)
    written = []
    original = search.append_placement

    def killed_after_seven(path, row):
        if len(written) == 7:
            raise KeyboardInterrupt
        written.append(row)
        original(path, row)

    monkeypatch.setattr(search, "append_placement", killed_after_seven)
    with pytest.raises(KeyboardInterrupt):
        place(model, text, tokenizer=tok, out=tmp_path / "resumed", mlp_loop=2, **SMALL)
    monkeypatch.undo()
    assert len(read_placements(tmp_path / "resumed" / "placements.jsonl")) == 7
    resumed = place(model, text, tokenizer=tok, out=tmp_path / "resumed", mlp_loop=2, **SMALL)
    assert resumed.scored == len(whole.rows) - 7
    assert format_table(resumed, top=None) == format_table(whole, top=None)
    assert {r.key for r in resumed.rows} == {r.key for r in whole.rows}


def test_outputs(text, tmp_path):
    from loopeval.tools.placement.report import format_table

    model, tok = model_of(), word_tokenizer()
    result = place(model, text, tokenizer=tok, out=tmp_path, rank_by="kl", **SMALL)
    lines = (tmp_path / "placements.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["loop"] is None  # the unlooped model first
    first = json.loads(lines[1])
    assert set(first) >= {"loop", "operator", "beta", "times", "width", "start", "passes", "multiplier", "ppl", "ppl_t",
                          "temperature", "kl", "tokens"}
    assert [r.kl for r in result.ranked()] == sorted(r.kl for r in result.rows if r.loop)
    table = format_table(result, top=5).splitlines()
    assert "unlooped" in table[1] and len(table) == 1 + 1 + 5 + 2
    looped = result.ranked()
    better = sum(r.ratio_ci[1] < 1 for r in looped)
    worse = sum(r.ratio_ci[0] > 1 for r in looped)
    assert table[-1].startswith(f"{better} candidate(s) have a PPL_T distinguishably below the unlooped model's, "
                                f"{worse} above, {len(looped) - better - worse} are not distinguishable")
    page = (tmp_path / "placement.html").read_text()
    assert page.count("<svg") == 1 and not re.search(r"(src|href)=[\"']https?:|<script|<link", page)  # self-contained
    assert page.count("<tr") == 1 + len(result.rows)


def test_correlate(text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    result = place(model, text, tokenizer=tok, out=tmp_path / "a", **SMALL)
    rows = result.ranked()[::4]
    results = tmp_path / "results.jsonl"
    # accuracy falling with PPL_T: PPL_T ranks these placements exactly in accuracy order
    results.write_text("".join(json.dumps({"loop": r.loop, "operator": r.operator, "beta": r.beta,
                                           "accuracy": 1 - i / 100}) + "\n" for i, r in enumerate(rows)))
    again = place(model, text, tokenizer=tok, out=tmp_path / "a", results=results, **SMALL)
    assert again.scored == 0
    (ppl_t,) = [c for c in again.correlations if c.metric == "ppl_t"]
    assert ppl_t.statistic == pytest.approx(1.0) and ppl_t.n == len(rows)
    assert "Spearman" in (tmp_path / "a" / "placement.html").read_text()


# -- bad input ----------------------------------------------------------------------


def _no_forward(model):
    def hook(*args):
        raise AssertionError("a forward pass ran")

    model.get_decoder().register_forward_pre_hook(hook)
    return model


@pytest.mark.parametrize("options, message", [
    (dict(widths=[7, 8]), "no window fits"),
    (dict(starts=[6]), r"starts \[6\]"),
    (dict(times=[1, 2]), "K must be >= 2"),
    (dict(betas=[0.5, 1.5]), r"\[0, 1\]"),
    (dict(operator="repeat", betas=[0.25]), "only the 'damped'"),
    (dict(rank_by="bleu"), "rank_by"),
    (dict(dtype="float8"), "dtype"),
])
def test_bad_options_fail_before_any_forward(options, message, text, tmp_path):
    model = _no_forward(model_of())
    with pytest.raises(ValueError, match=message):
        place(model, text, tokenizer=word_tokenizer(), out=tmp_path, **{**SMALL, **options})
    assert not (tmp_path / "placements.jsonl").exists()


@pytest.mark.parametrize("content, message", [("", "no documents"), ('{"text": "t5 t6"}\n', "too short"),
                                              ('{"text": "t5"}\n{"txt": "t7"}\n', ":2: corrupt text line")])
def test_bad_text_fails_before_any_forward(content, message, tmp_path):
    path = tmp_path / "text.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        place(_no_forward(model_of()), path, tokenizer=word_tokenizer(), out=tmp_path / "out", **SMALL)


def test_unsupported_architectures_fail_before_any_forward(text, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Olmo2Config, Olmo2ForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        place(gpt2, text, tokenizer=word_tokenizer(), out=tmp_path, **SMALL)
    olmo = _no_forward(Olmo2ForCausalLM(Olmo2Config(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB)))
    with pytest.raises(ValueError, match="Olmo2DecoderLayer"):
        place(olmo, text, tokenizer=word_tokenizer(), out=tmp_path, mlp_loop=2, **SMALL)


def test_corrupt_placements_line_is_named(text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    place(model, text, tokenizer=tok, out=tmp_path, **SMALL)
    path = tmp_path / "placements.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"  # a line cut short, as by a kill mid-write
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match=rf"{path}:3: corrupt placements line"):
        place(_no_forward(model), text, tokenizer=tok, out=tmp_path, **SMALL)


def test_another_search_in_the_folder_is_refused(text, tmp_path):
    model, tok = model_of(), word_tokenizer()
    place(model, text, tokenizer=tok, out=tmp_path, **SMALL)
    with pytest.raises(ValueError, match="seq_len: 16 there, 32 now"):
        place(_no_forward(model), text, tokenizer=tok, out=tmp_path, **{**SMALL, "seq_len": 32})


def test_changed_settings_are_refused_before_the_weights_load(text, tmp_path, monkeypatch):
    import loopeval.core.checkpoint
    from loopeval.core.checkpoint import save_model

    save_model(model_of(), word_tokenizer(), tmp_path / "model")
    place(str(tmp_path / "model"), text, out=tmp_path / "out", **{**SMALL, "widths": [2], "times": [2], "betas": [0.0]})

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the settings were checked")

    monkeypatch.setattr(loopeval.core.checkpoint, "load_model", no_load)
    with pytest.raises(ValueError, match="seq_len: 16 there, 32 now"):
        place(str(tmp_path / "model"), text, out=tmp_path / "out", **{**SMALL, "seq_len": 32})


def test_resume_is_by_content_of_the_weights(text, tmp_path, capsys):
    """Issue 32: weights retrained into the same folder are searched again (the old results
    moved aside), never resumed by path; --no-rerun refuses; a README beside them changes nothing."""
    from loopeval.core.checkpoint import save_model
    from loopeval.cli import main

    small = {**SMALL, "widths": [2], "times": [2], "betas": [0.0]}
    save_model(model_of(), word_tokenizer(), tmp_path / "model")
    first = place(str(tmp_path / "model"), text, out=tmp_path / "out", **small)
    (tmp_path / "model" / "README.md").write_text("# a model card")
    assert place(str(tmp_path / "model"), text, out=tmp_path / "out", **small).scored == 0
    save_model(tiny_model("qwen3", num_layers=6, vocab_size=VOCAB, seed=5), word_tokenizer(), tmp_path / "model")
    with pytest.raises(ValueError, match=r"search made from other inputs \(weights: '[0-9a-f]+' there"):
        place(str(tmp_path / "model"), text, out=tmp_path / "out", rerun=False, **small)
    args = ["place", "--model", str(tmp_path / "model"), "--data", str(text), "--out", str(tmp_path / "out"),
            "--widths", "2", "--times", "2", "--betas", "0", "--seq-len", "16", "--batch-tokens", "320"]
    assert main([*args, "--no-rerun"]) == 2
    again = place(str(tmp_path / "model"), text, out=tmp_path / "out", **small)
    assert again.scored == first.scored == len(first.rows)  # every row scored again
    assert again.unlooped.ppl != first.unlooped.ppl
    (old,) = (tmp_path / "out" / ".replaced").iterdir()
    assert read_placements(old / "placements.jsonl") == list(first.rows)
    assert "searched with other inputs (weights changed)" in capsys.readouterr().err


# -- the command line ---------------------------------------------------------------


def test_cli(text, tmp_path, capsys):
    from loopeval.core.checkpoint import save_model
    from loopeval.cli import main

    save_model(model_of(), word_tokenizer(), tmp_path / "model")
    args = ["place", "--model", str(tmp_path / "model"), "--data", str(text), "--out", str(tmp_path / "out"),
            "--widths", "2-3", "--times", "2", "--betas", "0,0.5", "--seq-len", "16", "--batch-tokens", "64",
            "--mlp-loop", "1", "--top", "3"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "unlooped" in printed and "/mlp" in (tmp_path / "out" / "placements.jsonl").read_text()
    assert main([*args[:-2], "--times", "1"]) == 2
    assert "K must be >= 2" in capsys.readouterr().err


# -- the noise: bootstrap intervals against exact enumeration ---------------------------


def test_bootstrap_interval_matches_exact_enumeration():
    """Five test documents: all 5^5 equally likely resamples enumerated give the exact
    bootstrap distribution of PPL_T and of the paired ratio; 20,000 random resamples must
    put each interval end between the exact 2% and 3% (97% and 98%) quantiles."""
    import itertools

    nll = np.array([40.0, 7.5, 120.0, 3.0, 61.0])
    tokens = np.array([20.0, 5.0, 40.0, 1.0, 30.0])
    base = np.array([38.0, 8.0, 118.0, 3.5, 63.0])
    means, diffs = [], []
    for idx in itertools.product(range(5), repeat=5):
        idx = list(idx)
        t = tokens[idx].sum()
        means.append(nll[idx].sum() / t)
        diffs.append((nll[idx].sum() - base[idx].sum()) / t)
    got = ppl_interval(nll, tokens, base, n_resamples=20_000, seed=3)
    for values, interval in ((means, got.confidence_interval), (diffs, got.ratio_interval)):
        q = np.exp(np.quantile(values, [0.02, 0.03, 0.97, 0.98]))
        assert q[0] <= interval.low <= q[1] and q[2] <= interval.high <= q[3]
    assert got.statistic == pytest.approx(math.exp(nll.sum() / tokens.sum()))
    assert got.ratio == pytest.approx(math.exp((nll.sum() - base.sum()) / tokens.sum()))
    same = ppl_interval(base, tokens, base)
    assert tuple(same.ratio_interval) == (1.0, 1.0) and not same.distinguishable


# -- one loop from placement to evaluation -----------------------------------------------


def test_best_loop_is_handed_over_whole(text, tmp_path):
    """The best candidate's loop_config.json and printed lm_eval / serve-cost arguments give
    back exactly the loop that was scored (operator and beta included), and a spec given
    alone gets the operator place searches with."""
    from loopeval.core.loop import resolve_loop
    from loopeval.core.spec import LoopConfig, read_loop_config
    from loopeval.tools.placement.report import handoff

    model, tok = model_of(), word_tokenizer()
    result = place(model, text, tokenizer=tok, out=tmp_path, starts=[2], **{**SMALL, "betas": [0.25, 0.5]})
    best = result.ranked()[0]
    scored = LoopConfig(best.loop, best.operator, best.beta)
    assert read_loop_config(tmp_path) == scored
    lines = handoff(result, "CKPT").splitlines()
    args = dict(kv.split("=", 1) for kv in lines[1].split("--model_args ")[1].split(","))
    assert args["pretrained"] == "CKPT"
    assert resolve_loop(model, args["loop"], operator=args["loop_operator"], beta=float(args["loop_beta"])) == scored
    flags = lines[2].split()
    assert (flags[flags.index("--loop") + 1], flags[flags.index("--operator") + 1],
            float(flags[flags.index("--beta") + 1])) == (best.loop, best.operator, best.beta)
    assert resolve_loop(model, "2:4x2").operator == build_grid(6)[0].operator == "damped"


def test_location_profile_clips_catastrophic_windows(text, tmp_path):
    """Windows at layer 1 made 50x worse than the unlooped model: the axis still spans the
    others (relative to unlooped, in %), and the clipped points are counted."""
    import dataclasses

    from loopeval.tools.placement.report import CLIP, location_profile_svg, profile_lines

    model, tok = model_of(), word_tokenizer()
    result = place(model, text, tokenizer=tok, out=tmp_path, starts=[1, 2, 3], **SMALL)
    rows = list(result.rows)
    rows = [dataclasses.replace(r, ppl_t=50 * result.unlooped.ppl_t) if r.start == 1 else r for r in rows]
    broken = dataclasses.replace(result, rows=tuple(rows))
    lines = profile_lines(broken)
    assert max(v for line in lines.values() for v in line.values()) == pytest.approx(50.0)
    inside = sorted(v for line in lines.values() for v in line.values() if v <= CLIP)
    assert inside and inside[-1] < 1.1  # the other windows stay readable on the clipped axis
    svg = location_profile_svg(broken)
    clipped = sum(v > CLIP for line in lines.values() for v in line.values())
    assert clipped == len(SMALL["widths"]) * len(SMALL["times"])  # one per (width, K) line at start 1
    assert f"{clipped} point(s) above +25%" in svg and "50x the unlooped" in svg


def test_too_few_test_documents_call_nothing_distinguishable():
    """Two documents far apart still give an interval that excludes 1, but only three
    distinct resamples exist: the candidate is undecided, and the table says why."""
    from loopeval.tools.placement.noise import MIN_TEST_DOCUMENTS

    tokens = np.array([50.0, 60.0])
    few = ppl_interval(np.array([100.0, 130.0]), tokens, np.array([60.0, 70.0]))
    assert few.ratio_interval.low > 1.0 and few.distinguishable is None
    n = MIN_TEST_DOCUMENTS
    enough = ppl_interval(np.full(n, 100.0), np.full(n, 50.0), np.full(n, 60.0))
    assert enough.distinguishable is True
