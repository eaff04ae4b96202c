"""Model directories built locally (random weights, real architectures and tokenizer types)."""

from bidirl.models.make import ARCHS, ModelShape, make_model, shape_of

__all__ = ["ARCHS", "ModelShape", "make_model", "shape_of"]
