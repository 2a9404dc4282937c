"""Observability: metrics, the HTTP endpoints, health and log format."""
