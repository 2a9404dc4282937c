"""Source: what a Kafka range becomes where it is read (decoded, and on the plain path reduced), and per-partition event time."""
