"""Persys Intelligence: read-only analysis of what the cluster shows (docs/intelligence.md).

Pure rules over an evidence bundle (`evidence.Evidence`) give ranked `findings.Finding`s, each
citing the evidence it rests on; the retriever (`retriever.py`) is the only part doing I/O, and
reads through the client API as its own identity holding viewer rights only.
"""
