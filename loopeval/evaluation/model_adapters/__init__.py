"""lm-evaluation-harness models provided by loopeval: ``looped`` (``loopeval.evaluation.model_adapters.looped.LoopedLM``).

The source lives in the repository's top-level ``model_adapters/`` folder. A wheel
installs it inside this package; in a checkout or an editable install, this package
reads it from that folder (as :mod:`loopeval.common.paths` does for ``tasks/`` and ``reports/``).
"""

import os

_checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "model_adapters")
if os.path.isfile(os.path.join(_checkout, "looped.py")):
    __path__.append(_checkout)
