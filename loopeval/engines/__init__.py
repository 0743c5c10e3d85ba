"""Engines beside the HF path: the vLLM engine (looped vLLM models, generation under loopeval's rules)."""
