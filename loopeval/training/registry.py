"""Every training recipe by name: the one place that knows them all (``joint`` builds on
:mod:`loopeval.training.recipes` in its own module, so the registry sits above both)."""

from __future__ import annotations

from loopeval.core.spec import LoopConfig
from loopeval.training import loop_convert
from loopeval.training.config import TrainConfig
from loopeval.training.joint import Joint
from loopeval.training.recipes import ContinuedPretraining, Convert, Full, LoopConvert, Recipe


def recipe_classes() -> dict[str, type[Recipe]]:
    """Every recipe's class by name, in ``RECIPES`` order."""
    return {cls.name: cls for cls in (Full, Convert, ContinuedPretraining, Joint, LoopConvert)}


RECIPE_OPERATORS = {"loop-convert": loop_convert.OPERATOR}
"""Recipes whose paper fixes the loop operator: it is used when none is given (and the recipe checks it)."""


def make_recipe(config: TrainConfig, loop: LoopConfig | None) -> Recipe:
    return recipe_classes()[config.recipe](config, loop)
