"""Model directories built locally: real architectures with random weights and real tokenizer
types (``make``), bidirl's tiny character-level model (``tiny``) and its supervised warm
start (``warm_start``)."""

from bidirl.models.make import ARCHS, ModelShape, make_model, shape_of

__all__ = ["ARCHS", "ModelShape", "make_model", "shape_of"]
