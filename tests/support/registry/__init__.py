"""Schema registries the tests run against: Apicurio Registry as a JVM subprocess (`apicurio`)."""
