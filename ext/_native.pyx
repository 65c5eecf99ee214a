# cython: language_level=3
"""Native core of lookupdec (placeholder until the suffix array lands)."""

def version():
    return 1
