"""Transformer Explorer."""
from .threads import passive_waits

passive_waits()  # before anything imports torch: OpenMP reads its wait policy once (threads.py says why)
