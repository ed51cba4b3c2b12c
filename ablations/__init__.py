"""Named ablations, the sweep runner, reports and benchmarks (``python -m ablations``)."""
