"""A process tree's CPU and memory, and the machine's CPU, read from /proc (Linux): the benchmarks' one reader.

`proc_stats()` reads every process's parent, CPU seconds and RSS in one pass; `process_tree` picks a root
and its descendants out of them; `tree_rss_mib` sums a tree's RSS. `CpuSamples.take()` records the machine's
busy and total CPU seconds (`/proc/stat`, every core), the tree's CPU seconds by kind of process (the JVM,
pyspark's Python workers, the driver; a process that ended takes its seconds with it) and its RSS;
`cores(t0, t1)` gives how many cores were busy on average between two times, for the machine, the tree and
each kind, from the samples nearest to them.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20

Stats = dict[int, tuple[int, float, float]]
"""pid -> (parent pid, CPU seconds so far (user + system), RSS MiB)."""


def proc_stats() -> Stats:
    """Every process's parent, CPU seconds and RSS, one /proc read each."""
    stats = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        stats[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK,
                                        int(fields[21]) * _PAGE_MIB)
    return stats


def process_tree(root: int, stats: Stats, exclude: set[int] = frozenset()) -> set[int]:
    """`root` and its descendants, except the `exclude` subtrees."""
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, (ppid, _, _) in stats.items() if ppid in tree and pid not in exclude} - tree
        tree, grew = tree | found, bool(found)
    return tree & set(stats)


def tree_rss_mib(root: int, exclude: int | None = None) -> float:
    """Summed RSS of `root` and its descendants, except the `exclude` subtree."""
    stats = proc_stats()
    return sum(stats[pid][2] for pid in process_tree(root, stats, {exclude} if exclude else set()))


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of every core since boot: idle and iowait are not busy."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return (total - fields[3] - fields[4]) / _TICK, total / _TICK


def _kind(pid: int) -> str:
    """'jvm', 'python workers' (pyspark's daemon and its workers) or 'driver' (the rest of the tree)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "driver"
    if argv and argv[0].endswith(b"java"):
        return "jvm"
    return "python workers" if any(b"pyspark.daemon" in a or b"pyspark.worker" in a for a in argv) else "driver"


class CpuSamples:
    """Timed samples of the machine's CPU and a process tree's CPU (by kind) and RSS."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.times: list[float] = []
        self.rows: list[tuple[float, float, dict[str, float]]] = []  # machine busy, machine total, tree by kind
        self.peak_rss_mib = 0.0

    def take(self, now: float) -> None:
        busy, total = machine_cpu_s()
        stats = proc_stats()
        kinds: dict[str, float] = {}
        rss = 0.0
        for pid in process_tree(self.root, stats):
            kind = _kind(pid)  # read each time: spark-class's shell becomes the JVM by exec
            kinds[kind] = kinds.get(kind, 0.0) + stats[pid][1]
            rss += stats[pid][2]
        self.times.append(now)
        self.rows.append((busy, total, kinds))
        self.peak_rss_mib = max(self.peak_rss_mib, rss)

    def _at(self, when: float) -> int:
        i = bisect.bisect_left(self.times, when)
        if i == len(self.times) or (i > 0 and when - self.times[i - 1] < self.times[i] - when):
            i -= 1
        return i

    def cores(self, start: float, end: float) -> dict | None:
        """Average busy cores between `start` and `end` (the samples nearest them): the machine's, the
        tree's and its kinds'; None without two distinct samples in between."""
        if not self.times:
            return None
        a, b = self._at(start), self._at(end)
        if b <= a:
            return None
        seconds = self.times[b] - self.times[a]
        (busy0, total0, tree0), (busy1, total1, tree1) = self.rows[a], self.rows[b]
        cores = os.cpu_count() or 1
        kinds = {kind: (tree1.get(kind, 0.0) - tree0.get(kind, 0.0)) / seconds for kind in tree1}
        return {"seconds": seconds, "machine": (busy1 - busy0) / (total1 - total0) * cores if total1 > total0 else 0.0,
                "tree": sum(kinds.values()), "kinds": kinds}
