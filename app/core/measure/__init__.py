"""Measuring: plans, prompt suites, the sweep runner (a generator of typed events), the cost probe
(read app.core.session.cost_probe first: its entry point and a map of the cost code), the self-test."""
