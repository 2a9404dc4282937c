"""Checks of the repository itself: compose, k8s, packaging, types, benchmarks run."""
