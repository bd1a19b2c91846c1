"""Simulated tiers, clocks and faults for tests: everything nondeterministic, made scriptable."""
