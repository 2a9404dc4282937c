"""Runtime: the Spark session, checkpoint housekeeping and every knob that exists only for speed or memory on a machine."""
