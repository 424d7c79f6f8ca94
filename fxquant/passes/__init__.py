"""Graph passes over a traced model: one file per pass."""

from fxquant.passes.insert_truncation import insert_truncation, transform, truncations

__all__ = ["insert_truncation", "transform", "truncations"]
