"""The service under chaos for `chaos_benchmark.py`: launches, SIGKILLs, broker kills, and what happened.

Each `cdc-lakehouse run CONFIG` process runs in a process group of its own (driver, JVM,
Python workers), so a SIGKILL takes all of it, as a machine failure would. Progress is read from
the service's own log: `pipeline NAME: batch N ...` and `export NAME: batch N ...` lines.

A broker kill is a SIGKILL of the Apache Kafka process with whatever is in flight (the feeder's
records, the service's reads and its export transaction), no warning to anyone; the broker is
restarted on the same log directory (log recovery, same ports and cluster id) after a while, and
the service rides the outage out through its recovery settings.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_workload import Feeder

from connectors.kafka.apache_broker import ApacheKafkaBroker

CLI = str(Path(sys.executable).with_name("cdc-lakehouse"))
NAMES = {"plain": "pipeline plain", "dedup": "pipeline dedup", "export": "export plain-export"}
PROGRESS_TIMEOUT_S = 240.0
# Down this long before the restart begins; the restart after a SIGKILL (log recovery) adds 10-40 s here,
# so a query planning a batch meanwhile fails (the source's 15 s metadata timeout) and is restarted by the
# service's recovery, while one reading or publishing inside a trigger waits for the broker.
DOWN_S = (5.0, 20.0)
BATCH = re.compile(r"(pipeline \S+|export \S+): batch \d+ ")
RESTART = re.compile(r"; restart \d+ of \d+ in ")
MAX_EXITS_IN_A_ROW = 3


class ServiceDown(RuntimeError):
    """The service keeps exiting on its own: the chaos cannot go on."""


@dataclass
class Incarnation:
    """One `cdc-lakehouse run` process and its log."""

    process: subprocess.Popen
    log: Path
    launched: float

    def text(self, start: int = 0) -> str:
        """The log from byte `start` on."""
        with self.log.open("rb") as handle:
            handle.seek(start)
            return handle.read().decode(errors="replace")

    def size(self) -> int:
        """The log's length so far."""
        return self.log.stat().st_size

    def progressed(self, since: int = 0, names: tuple[str, ...] = tuple(NAMES.values())) -> bool:
        """Each of `names` (default: every pipeline and the export) logged a batch after byte `since`."""
        return set(BATCH.findall(self.text(since))) >= set(names)

    def restarts(self, since: int = 0) -> int:
        """Pipeline restarts by the service's recovery logged after byte `since`."""
        return len(RESTART.findall(self.text(since)))


@dataclass
class Chaos:
    """The service under chaos: launches, kills, freezes; what happened."""

    config: Path
    workdir: Path
    runs: list[Incarnation] = field(default_factory=list)
    kills: int = 0
    relaunched: list[int] = field(default_factory=list)  # indices of the runs launched after a kill
    startup_kills: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    exits_in_a_row: int = 0
    stalls: int = 0
    broker_kills: int = 0
    broker_recoveries: int = 0  # broker kills after which every pipeline and the export committed again

    @property
    def current(self) -> Incarnation:
        return self.runs[-1]

    def launch(self) -> Incarnation:
        """Start a new service process in its own process group."""
        log = self.workdir / f"service-{len(self.runs):02d}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen([CLI, "run", str(self.config)], stdout=handle, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.runs.append(Incarnation(process, log, time.monotonic()))
        return self.current

    def alive(self) -> bool:
        """True while the current process runs; one that exited on its own is noted and relaunched,
        unless it is the third in a row (then ServiceDown)."""
        run = self.current
        if run.process.poll() is None:
            return True
        lines = [line for line in run.text().splitlines() if line.strip()] or ["(empty log)"]
        error = next((line for line in reversed(lines) if line.startswith("error: ")), lines[-1])
        self.unexpected_exits.append(f"{run.log.name}: exit {run.process.returncode}: {error}")
        self.exits_in_a_row += 1
        if self.exits_in_a_row >= MAX_EXITS_IN_A_ROW:
            raise ServiceDown(f"the service exited on its own {self.exits_in_a_row} times in a row; last: {error}")
        print(f"  service exited on its own (exit {run.process.returncode}); relaunched", flush=True)
        self.launch()
        return False

    def wait_progress(self, since: int, names: tuple[str, ...] = tuple(NAMES.values())) -> bool:
        """Until each of `names` logged a batch after byte `since` of the current log."""
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                since = 0
            elif self.current.progressed(since, names):
                return True
            time.sleep(0.5)
        self.stalls += 1
        return False

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the current process group."""
        try:
            os.killpg(self.current.process.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group; returns once no process of the group is left."""
        self.signal_group(signal.SIGKILL)
        self.current.process.wait(timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.current.process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        self.kills += 1
        self.exits_in_a_row = 0

    def stop(self) -> int:
        """SIGTERM to the driver alone (a graceful stop: it stops the JVM itself); the exit code."""
        self.current.process.send_signal(signal.SIGTERM)
        return self.current.process.wait(timeout=300)


def moment(chaos: Chaos, rng: random.Random, fresh: bool, startup: bool) -> str:
    """Wait for a random moment of the current process and say which.

    In a process just launched: a fifth of the time 1-25 s after launch (start-up; only when
    `startup`), else 0-8 s after the first batch of a pipeline picked at random. Otherwise 0-8 s
    after every pipeline and the export logged a batch.
    """
    if fresh and startup and rng.random() < 0.2:
        delay = rng.uniform(1.0, 25.0)
        time.sleep(max(0.0, chaos.current.launched + delay - time.monotonic()))
        chaos.startup_kills += 1
        return f"{delay:.1f} s after launch"
    names = (rng.choice(list(NAMES.values())),) if fresh else tuple(NAMES.values())
    progressed = chaos.wait_progress(0 if fresh else chaos.current.size(), names)
    delay = rng.uniform(0.0, 8.0)
    time.sleep(delay)
    after = f"{names[0]}'s first batch" if fresh else "a batch of every pipeline"
    return f"{delay:.1f} s after {after}" if progressed else f"after waiting {PROGRESS_TIMEOUT_S:.0f} s for {after}"


def broker_kill(broker: ApacheKafkaBroker, rng: random.Random) -> float:
    """SIGKILL the broker mid-traffic, keep it down a while, restart it on the same log directory;
    the seconds it was away (until it answered again)."""
    killed = time.monotonic()
    broker.kill()
    time.sleep(rng.uniform(*DOWN_S))
    broker.start()
    return time.monotonic() - killed


def run_chaos(chaos: Chaos, broker: ApacheKafkaBroker, feeder: Feeder, steps: list[str], rng: random.Random) -> None:
    """Each step: wait for a random moment, then kill and relaunch the service, or kill and restart the broker."""
    fresh = True
    for number, step in enumerate(steps, 1):
        when = moment(chaos, rng, fresh, startup=step == "kill")
        if step == "kill":
            chaos.kill()
            chaos.launch()
            chaos.relaunched.append(len(chaos.runs) - 1)
        else:
            mark = chaos.current.size()
            away = broker_kill(broker, rng)
            recovered = chaos.wait_progress(mark)
            chaos.broker_kills += 1
            chaos.broker_recoveries += recovered
            when += f"; broker away {away:.0f} s, {chaos.current.restarts(mark)} pipeline restarts, "
            when += "then every pipeline committed again" if recovered else "NOT recovered within the timeout"
        fresh = step == "kill"
        print(f"  step {number:2d}/{len(steps)}: {step:<11} {when}", flush=True)
        if feeder.error:
            raise SystemExit(f"FAILED: the feeder stopped: {feeder.error}")
