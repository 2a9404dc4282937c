"""The keyed-state materializer: its rules (pure, with a fast twin), key state, net changes, and its Spark stages."""
