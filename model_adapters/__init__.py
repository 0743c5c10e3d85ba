"""lm-evaluation-harness models provided by loopeval: ``looped`` (``model_adapters.looped.LoopedLM``)."""
