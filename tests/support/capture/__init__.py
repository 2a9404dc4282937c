"""Real change capture for end-to-end tests: a private PostgreSQL cluster, the Debezium engine, a workload."""
