"""Plan: the compiled plan of stateful operators, upgrade checks, and state rebuilt from a Delta table."""
