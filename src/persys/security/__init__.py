"""Cluster PKI and mutual TLS helpers."""
