"""Typed IR records (frozen dataclasses), the format registry, the model config and the graph."""
