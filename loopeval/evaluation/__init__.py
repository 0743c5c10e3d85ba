"""Floor 2, evaluation: decoding rules, the trace, the response store, scoring, serving measurements, and lm-eval's ``looped`` model."""
