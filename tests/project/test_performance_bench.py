"""The performance benchmark's yardsticks: the naive pipeline's table and the latency reading.

The benchmark scripts live in bench/ (not a package); they are imported from there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from perf_freshness import Sent, latencies, percentile  # noqa: E402
from perf_naive import run_naive  # noqa: E402

from service.operations.workload import DebeziumWorkload, create_topics, produce  # noqa: E402


def test_naive_pipeline_table_equals_the_replay(kafka_bootstrap: str, unique: str, workdir: Path) -> None:
    topic = f"perf.naive.{unique}"
    workload = DebeziumWorkload(topic, 2, schema="mixed", seed=3)
    create_topics(kafka_bootstrap, [topic], 2)
    produced = produce(kafka_bootstrap, workload.generate(3_000, 400))

    figures = run_naive(kafka_bootstrap, topic, 2, str(workdir / "naive"), window=1_000)

    table = DeltaTable(str(workdir / "naive")).to_pyarrow_table().sort_by("id")
    assert figures["records"] == produced and figures["merges"] >= 3
    assert table.to_pylist() == workload.expected_rows()


def test_latency_is_the_first_commit_holding_the_event_or_a_later_change(workdir: Path) -> None:
    uri = str(workdir / "fresh")
    schema = pa.schema([("id", pa.int64()), ("email", pa.string())])

    def commit(rows: list[tuple[int, int]]) -> float:
        source = pa.table({"id": [k for k, _ in rows], "email": [f"u{k}.{c}@example.com" for k, c in rows]},
                          schema=schema)
        (DeltaTable(uri).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
        return DeltaTable(uri).history(1)[0]["timestamp"] / 1000

    write_deltalake(uri, schema.empty_table(), configuration={"delta.enableChangeDataFeed": "true"})
    first = commit([(1, 10), (2, 11)])
    second = commit([(1, 13)])  # key 1 at clock 12 was superseded by 13 within this batch
    sent = [Sent(1, 10, first - 2), Sent(2, 11, first - 1), Sent(1, 12, second - 4), Sent(1, 13, second - 3)]

    assert [round(value, 3) for value in latencies(uri, sent)] == [2, 1, 4, 3]
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0 and percentile([1.0, 2.0, 3.0], 0.95) == 3.0


def test_ingest_benchmark_finds_the_runners_ready_line() -> None:
    """The benchmark times the service from the runner's `kafka: ...` line: a plain-text log record
    of the runner's own logger, formatted as the service formats it, must match its pattern."""
    import logging

    from ingest_benchmark import _READY_LINE

    from service.observability.log_format import TEXT_FORMAT
    from service.supervisor import runner

    record = logging.LogRecord(runner.log.name, logging.INFO, __file__, 1, "kafka: %s", ("{}",), None)
    line = logging.Formatter(TEXT_FORMAT).format(record)
    assert _READY_LINE.search(line + "\n"), line


def test_the_read_floor_deals_partitions_and_cuts_a_lone_one_into_pieces() -> None:
    from read_floor import dealt

    four = [("t", p, 0, 100) for p in range(4)]
    assert dealt(four, 2) == [[four[0], four[2]], [four[1], four[3]]]
    assert dealt([("t", 0, 10, 111)], 2) == [[("t", 0, 10, 60)], [("t", 0, 60, 111)]]
    assert dealt([("t", 0, 5, 6)], 2) == [[("t", 0, 5, 6)], []]  # too few records to cut


def test_the_realistic_table_shows_each_rows_read_floor_against_the_best_row() -> None:
    from realistic_benchmark import table_lines

    rows = {"a": {"records": 10, "bytes_per_record": 100, "naive": {"rate": 50.0},
                  "service": {"steady_rate": 100.0, "table_differs": None}, "floor": {"rate": 400.0, "mb_s": 0.04}},
            "b": {"records": 10, "bytes_per_record": 1000, "naive": {"rate": 20.0},
                  "service": {"steady_rate": 40.0, "table_differs": None,
                              "stages": {"batches": 1, "read_decode_reduce_s": 0.8, "merge_s": 0.25},
                              "steady_cores": {"seconds": 3.0, "machine": 1.874, "tree": 1.52,
                                               "kinds": {"driver": 0.4, "jvm": 0.31, "python workers": 0.81}}},
                  "floor": {"rate": 60.0, "mb_s": 0.06, "reader_us": 7.14, "broker_us": 2.06}}}
    lines = table_lines({"rows": rows, "cores": 2})
    header, rule, first, second = lines[:4]
    cells = [line.strip("|").split(" | ") for line in (header, first, second)]
    assert len({len(row) for row in cells}) == 1 and len(rule.split("|")) == len(header.split("|"))
    floor_at, ceiling_at = cells[0].index("read floor ev/s (MB/s)"), cells[0].index("floor vs best row")
    assert (cells[1][floor_at], cells[1][ceiling_at]) == ("400 (0)", "x4.00")
    assert (cells[2][floor_at], cells[2][ceiling_at]) == ("60 (0)", "x0.60")  # below 0.7 of the best: out of reach
    stages_at = cells[0].index("steady batches: read+decode+reduce / merge s")
    assert (cells[1][stages_at], cells[2][stages_at]) == ("-", "0.80 / 0.25")
    cores_at = cells[0].index("cores busy in the steady window: machine (service: driver / JVM / Python workers)")
    assert (cells[1][cores_at], cells[2][cores_at]) == ("-", "1.87 (1.52: 0.40 / 0.31 / 0.81)")
    cpu_at = cells[0].index("read CPU us/record (readers + broker)")
    assert (cells[1][cpu_at], cells[2][cpu_at]) == ("-", "7.1 + 2.1")
    budget = [line for line in lines if line.startswith("CPU per record")]
    assert budget and "2 cores busy: 28571.4 us" in budget[0]  # 2 / (0.7 * 100 events/s)


def test_the_steady_stages_are_the_batch_lines_after_the_first(tmp_path: Path) -> None:
    from realistic_benchmark import steady_stages

    line = ("2026-12-03 03:35:32,310 INFO service.kafka_to_delta.pipeline: pipeline bench: batch {} -> /t/bench: "
            "62833 upserts, 5431 deletes from 4 Kafka range(s) (4 in bulk) (read+decode+reduce {}s, merge {}s)\n")
    log = tmp_path / "pipeline.log"
    log.write_text(line.format(0, "3.01", "1.05"))
    assert steady_stages(log) is None
    log.write_text(line.format(0, "3.01", "1.05") + "other line\n" + line.format(1, "1.83", "0.45")
                   + line.format(2, "1.00", "0.25"))
    assert steady_stages(log) == {"batches": 2, "read_decode_reduce_s": 2.83, "merge_s": 0.7}


def test_the_read_floor_reads_a_process_cpu_time_from_proc() -> None:
    import os
    import time

    from read_floor import process_cpu_s

    before, started = process_cpu_s(os.getpid()), time.process_time()
    while time.process_time() - started < 0.3:  # burn CPU, as much as a clock tick many times over
        sum(range(1000))
    assert process_cpu_s(os.getpid()) - before >= 0.2


def test_the_steady_window_starts_where_the_first_batch_job_ended() -> None:
    """The next batch's job runs during the first commit: the window starts at that commit's start, so a
    longer first commit cannot shorten it."""
    from ingest_benchmark import _log_time, log_figures

    line = ("{} INFO service.kafka_to_delta.pipeline: pipeline bench: batch {} -> /t/bench: 10 upserts, 0 deletes "
            "from 1 Kafka range(s) (1 in bulk) (read+decode+reduce 1.00s, merge {}s)\n")
    text = ("2026-12-04 03:00:00,000 INFO service.supervisor.runner: kafka: localhost:9092\n"
            + line.format("2026-12-04 03:00:05,000", 0, "2.50") + "other line\n"
            + line.format("2026-12-04 03:00:06,000", 1, "0.40")
            + line.format("2026-12-04 03:00:07,500", 2, "0.40"))
    started = _log_time("2026-12-04 02:59:58,000")
    figures = log_figures(text, started, started + 12)
    assert figures["batches"] == 3 and figures["first_merge"] == 2.5
    assert abs(figures["after_first"] - 5.0) < 1e-6  # 07.5 less (05.0 - 2.5), not 07.5 - 05.0
    assert abs(figures["startup"] - 2.0) < 1e-6 and abs(figures["ingest"] - 7.5) < 1e-6


def test_the_steady_trigger_cuts_a_row_into_the_batches_asked_for() -> None:
    from realistic_benchmark import steady_trigger

    assert steady_trigger(309_609, 5) == 61_922  # 4 x 61,922 + 61,921
    assert steady_trigger(300_000, 5) == 60_000
    assert -(-309_609 // steady_trigger(309_609, 5)) == 5


def test_cpu_samples_count_the_cores_a_busy_process_tree_keeps_busy() -> None:
    import os
    import time

    from cpu_samples import CpuSamples

    samples = CpuSamples(os.getpid())
    started, cpu = time.time(), time.process_time()
    samples.take(started)
    while time.process_time() - cpu < 0.3:  # one thread burns 0.3 CPU-s, however loaded the machine
        sum(range(1000))
    ended = time.time()
    samples.take(ended)
    busy = samples.cores(started, ended)
    assert busy is not None  # the burning thread is this process, a "driver" (a JVM the session started may idle)
    assert busy["kinds"]["driver"] <= 1.2 and busy["kinds"]["driver"] * busy["seconds"] >= 0.25
    assert busy["machine"] * busy["seconds"] >= 0.25
    assert samples.cores(ended, ended) is None  # no window between one sample and itself
    assert samples.peak_rss_mib > 0


def test_a_process_tree_holds_the_descendants_and_leaves_out_an_excluded_subtree() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from cpu_samples import proc_stats, process_tree, tree_rss_mib

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"])
    grandchildren: list[int] = []
    try:
        for _ in range(600):  # the grandchild appears once the child has started it
            stats = proc_stats()
            grandchildren = [pid for pid, (ppid, _, _) in stats.items() if ppid == child.pid]
            if grandchildren:
                break
            time.sleep(0.05)
        assert grandchildren, "the grandchild never started"
        assert {child.pid, grandchildren[0]} <= process_tree(os.getpid(), stats)
        assert not {child.pid, grandchildren[0]} & process_tree(os.getpid(), stats, {child.pid})
        assert tree_rss_mib(child.pid) > tree_rss_mib(child.pid, exclude=grandchildren[0]) > 0
    finally:
        for pid in grandchildren:
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
