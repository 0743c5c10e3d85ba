"""Checks the engine's test files share: the engine's greedy tokens against the HF path's."""

import gc


def assert_engine_tokens_equal_hf(path, model, loop, prompts, *, max_tokens=24, max_model_len=256, inspect=None,
                                  enforce_eager=(True,), engine_args=None):
    """Greedy tokens of the checkpoint at ``path`` looped by ``loop`` in vLLM (prefix caching on),
    once per setting in ``enforce_eager`` (``False``: vLLM compiles the model), each equal to
    those of ``model`` looped by ``apply_loop`` on the HF path, each to vLLM's end of
    sequence, up to the first step whose greedy token is a numerical tie on the HF path (its
    top two logits within float32 rounding of each other,
    :func:`loopeval.core.cache_check.rounding_tolerance`: two kernel stacks may break it
    either way, so the rest of that row is not compared); ``inspect`` runs on vLLM's model
    first (``LLM.apply_model``): returns its result per setting. ``engine_args``: more ``LLM``
    arguments (e.g. ``compilation_config``)."""
    import torch
    from transformers import AutoConfig

    from loopeval import apply_loop
    from loopeval.core.cache_check import clear_winner, rounding_tolerance
    from loopeval.engines.vllm_engine import configure_environment
    from loopeval.engines.vllm_models import engine_overrides, register

    configure_environment()  # one process: faster on 2 cores, and apply_model reaches the model
    register()
    from vllm import LLM, SamplingParams, TokensPrompt

    architecture = AutoConfig.from_pretrained(path).architectures[0]
    inspected, outputs = {}, {}
    for eager in enforce_eager:
        llm = LLM(str(path), dtype="float32", enforce_eager=eager, distributed_executor_backend="uni",
                  max_model_len=max_model_len, enable_prefix_caching=True,
                  hf_overrides=engine_overrides(architecture, loop), **(engine_args or {}))
        inspected[eager] = llm.apply_model(inspect)[0] if inspect is not None else None
        outputs[eager] = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                      SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
        del llm
        gc.collect()
    apply_loop(model, loop)
    compared = dict.fromkeys(enforce_eager, 0)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, output_logits=True,
                                return_dict_in_generate=True)
        logits = torch.cat(hf.logits).float()
        clear = clear_winner(logits, rounding_tolerance(logits, torch.float32)).tolist() + [False]
        n = clear.index(False)  # steps before the first numerical tie
        for eager in enforce_eager:
            out = outputs[eager][i].outputs[0]
            tokens = list(out.token_ids)  # to the end-of-sequence token, where HF pads
            assert tokens[:n] == hf.sequences[0, len(prompt):].tolist()[:min(n, len(tokens))], (eager, i)
            assert n < len(tokens) or len(tokens) == max_tokens or out.finish_reason == "stop"
            compared[eager] += min(n, len(tokens))
    # A tie is a top-two gap within float32 rounding (about 1e-6 of a logit): on these weights a
    # handful per prompt would take a chance of that order per step, so this cannot fail by luck.
    assert min(compared.values()) >= len(prompts) * 4, f"only {compared} greedy tokens compared before numerical ties"
    return inspected
