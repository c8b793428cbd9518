"""Worked examples of the docs: each is a real code location that the tests materialise."""
