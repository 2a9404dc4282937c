"""Sink: MERGE of net changes into Delta, once per micro-batch; bad-record policies and dead letters."""
