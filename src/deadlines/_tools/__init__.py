"""What the tools (`plan`, `sim`, `lab`) share: durations, TOML lines, percentiles.

One reading of ``"40ms"`` for every input file and flag, one way to name the line of
a bad key, and one percentile, so the tools agree with each other.
"""
