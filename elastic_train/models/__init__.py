"""Models: the registry (``mlp``, ``cnn``, ``gpt`` or a user's ``'package.module:function'``) and the GPT.

Only torch here (no Ray, no MLflow, no pydantic at run time).
"""

from elastic_train.models.registry import build_model, count_parameters

__all__ = ["build_model", "count_parameters"]
