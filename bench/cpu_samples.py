"""CPU use of the machine and of one process tree over time, sampled from /proc (Linux).

`CpuSamples.take()` records the machine's busy and total CPU seconds (`/proc/stat`, every core) and the
CPU seconds of a process tree by kind of process (`/proc/PID/stat` of the root and its live descendants: a
process that ended takes its seconds with it; the JVM, pyspark's Python workers, the driver); `cores(t0, t1)`
gives how many cores were busy on average between two times, for the machine, the tree and each kind, from
the samples nearest to them.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


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


def tree_cpu_s(root: int) -> dict[str, float]:
    """CPU seconds (user + system) of `root` and its live descendants, by kind of process (`_kind`)."""
    parents, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended while we looked
        fields = text[text.rindex(")") + 2:].split()
        pid = int(stat.parent.name)
        parents[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree, grew = tree | found, bool(found)
    kinds: dict[str, float] = {}
    for pid in tree:
        kind = _kind(pid)
        kinds[kind] = kinds.get(kind, 0.0) + cpu.get(pid, 0.0)
    return kinds


class CpuSamples:
    """Timed samples of the machine's CPU and a process tree's."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.times: list[float] = []
        self.rows: list[tuple[float, float, dict[str, float]]] = []  # machine busy, machine total, tree

    def take(self, now: float) -> None:
        busy, total = machine_cpu_s()
        self.times.append(now)
        self.rows.append((busy, total, tree_cpu_s(self.root)))

    def _at(self, when: float) -> int:
        i = bisect.bisect_left(self.times, when)
        if i == len(self.times) or (i > 0 and when - self.times[i - 1] < self.times[i] - when):
            i -= 1
        return i

    def cores(self, start: float, end: float) -> dict[str, float] | None:
        """Average busy cores between `start` and `end` (the samples nearest them): the machine's, the
        tree's; None without two distinct samples in between."""
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
