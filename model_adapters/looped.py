"""lm-eval model ``looped``: ``--model hf`` plus an exact loop, free decoding rules and a cost trace.

    lm_eval --model looped \\
        --model_args pretrained=PATH,loop=8:16x2,budget_forcing=true,trace=OUT[,engine=vllm] \\
        --tasks gsm8k_boxed --include_path $(loopeval tasks-path) \\
        --apply_chat_template --log_samples --output_path OUT

A thin lm-eval shell: :class:`LoopedLM` opens one :class:`loopeval.evaluation.session.Session`
(every check, the loop, the decoding rules, the plans, the trace, the resume store and
the identity) over the backend ``engine=`` names (:data:`BACKENDS`), which loads the
model and generates; every lm-eval call goes to that backend's model. The model args are
the fields of :class:`loopeval.evaluation.model_args.LoopedArgs` and the backend's
(docs/lm_eval_model.md, docs/engine.md). Rules default to off, so ``looped`` without a
loop reproduces ``--model hf``.

lm-eval passes its own ``--device`` and ``--batch_size`` (with their defaults, ``cuda:0``
and 1, even when the command line does not give them) beside the model args; a
``device=`` or ``batch_size=`` given in ``--model_args`` wins over lm-eval's default, and
one that contradicts the same flag given on the command line is refused.

lm-eval's ``--use_cache`` is refused: its key is the request alone, so it would serve
outputs made with another loop or rule. ``resume_dir=`` resumes a killed run safely.
"""

from __future__ import annotations

import importlib
import sys

from loopeval.common.threads import set_wait_policy

set_wait_policy()  # before torch starts its OpenMP runtime (loopeval.common.threads)

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.utils import simple_parse_args_string  # noqa: E402

from loopeval.common.errors import UserError  # noqa: E402
from loopeval.evaluation.model_args import explicit_flag  # noqa: E402
from loopeval.evaluation.session import Session  # noqa: E402

BACKENDS = {"hf": "loopeval.evaluation.hf_backend:HFBackend", "vllm": "loopeval.engines.vllm_backend:VLLMBackend"}
"""The backend of each ``engine=`` value, imported when chosen: a third backend is one entry here
and one backend class (:class:`loopeval.evaluation.session.Backend`)."""


def backend(engine) -> object:
    """The backend object of ``engine`` (a name of :data:`BACKENDS`); another name is refused."""
    name = str(engine).strip().lower()
    if name not in BACKENDS:
        raise UserError(f"looped: engine={engine!r}: choose one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


class LoopedLM(LM):
    """lm-eval's ``looped`` model: a session over the backend of ``engine=`` (module docstring)."""

    def __init__(self, pretrained=None, **model_args) -> None:
        super().__init__()
        self.session = Session(pretrained, model_args, backend(model_args.get("engine") or "hf"))
        self.lm = self.session.backend.load(self.session)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        args = dict(arg_dict)
        for name, value in (additional_config or {}).items():
            if value is None:
                continue
            if name not in args:
                args[name] = value
                continue
            given = explicit_flag(sys.argv, name)
            if given is not None and str(given) != str(args[name]):
                raise UserError(f"looped: {name}={args[name]} in --model_args contradicts --{name} {given}; give one")
        return cls(**args)

    # -- lm-eval's model interface, answered by the backend's model ---------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return self.lm.loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        return self.lm.loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests, disable_tqdm: bool = False):
        return self.lm.generate_until(requests, disable_tqdm=disable_tqdm)

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True):
        return self.lm.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    def chat_template(self, chat_template=False):
        return self.lm.chat_template(chat_template)

    @property
    def tokenizer_name(self) -> str:
        return self.lm.tokenizer_name

    def set_cache_hook(self, cache_hook) -> None:
        self.lm.set_cache_hook(cache_hook)

    @property
    def rank(self) -> int:
        return self.lm.rank

    @property
    def world_size(self) -> int:
        return self.lm.world_size

    @property
    def device(self):
        return self.lm.device

    def all_gather(self, tensor):
        return self.lm.all_gather(tensor)

    def gather_object(self, obj, dst=0):
        return self.lm.gather_object(obj, dst)

    def barrier(self) -> None:
        self.lm.barrier()

    def get_model_info(self) -> dict:
        return self.lm.get_model_info() if hasattr(self.lm, "get_model_info") else {}

    def __getattr__(self, name: str):
        # anything else (model, tokenizer, batch_sizes, ...) is the backend model's
        if name in ("lm", "session"):
            raise AttributeError(name)
        return getattr(self.lm, name)
