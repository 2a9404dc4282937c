"""FROM_CHANGELOG (spec 4.1): op mapping, ORDER BY event time, upsert unzip, and their Spark stage."""
