"""Runtime: the Spark session, checkpoint housekeeping and every knob that exists only for speed or memory on a machine.

The knobs (docs/design/runtime-tuning.md has the table: what chooses each, its test, its figures):
`jvm_profiles` (the local JVM's flags, chosen from the compiled plan's operators), `jvm_class_archive`
and `class_archive_workload` (the JVM's class archive), `spark_session` (the Spark settings),
`planner_workers` (Spark's idle planning daemons), `worker_warmup` (Python workers started early,
their imports chosen from the plan), `allocators` (native allocator settings), `memory_release`
(freed memory back to the system after each batch), `collector` (the cyclic collector paused while a
batch's acyclic values are built).

`project_code` is not a knob: it ships the project's code to a cluster's executors with the session.
"""
