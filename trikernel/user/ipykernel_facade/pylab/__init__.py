"""``ipykernel.pylab``: the deprecated home of the inline backend.

Runs on: the main thread at import.
"""
