"""Persys: an explainable compute control plane for machines you control."""

__version__ = "0.1.0"
