"""Benchmarks: run specs, store their results durably (``store``) and turn the stored rows into tables."""
