"""Numbers to judgements: statistics, per-cell analysis, the break-even model, recommendations, adaptive sweeps."""
