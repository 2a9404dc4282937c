"""Helpers of the tests alone: harnesses, drivers, doubles, capture and registry launchers."""
