"""lm-evaluation-harness models provided by loopeval (the top floor): ``looped``
(:class:`loopeval.model_adapters.looped.LoopedLM`), registered at start-up by
``loopeval-lm-eval.pth`` (:mod:`loopeval.model_adapters._register`)."""
