"""Measuring: plans, prompt suites, the sweep runner (a generator of typed events), the cost probe, the self-test."""
