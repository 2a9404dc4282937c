"""Delta change data feed -> Kafka: settings, the TO_CHANGELOG encoder and record layouts."""
