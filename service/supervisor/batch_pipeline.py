"""What every supervised pipeline (ingest, join, export) shares: its Delta application id and
the micro-batch entry point that keeps a failure for the runner (`service.supervisor.runner`) and
hands the batch's memory back to the system (`service.runtime.memory_release`)."""

from __future__ import annotations

from typing import Any, Callable

from service.runtime import memory_release


def with_trigger(writer: Any, until_idle: bool, interval_seconds: float) -> Any:
    """A `DataStreamWriter` with the service's trigger: everything available now, then stop
    (`until_idle`), or a micro-batch every `interval_seconds`."""
    if until_idle:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{interval_seconds} seconds")


def commit_app_id(name: str, table: str, query_id: str | None) -> str:
    """Application id of a pipeline's Delta commits; the query id ties it to the checkpoint."""
    return f"cdc-lakehouse/{name}/{table}/{query_id}"


class BatchPipeline:
    """Mixin: `process_batch` (the `foreachBatch` function) runs `_process_batch`; an exception is
    kept in `failure` (the runner reports the pipeline's own error object) and raised on. After each
    micro-batch, done or failed, the memory it freed goes back to the system (`memory_release`).

    `on_first_batch` (set by the runner before each start) is called when the query enters its first
    micro-batch: by then Spark has planned its sources.

    A pipeline whose commits run behind its micro-batches keeps a commit that failed there in
    `failed_behind`; `settle_commits` (called by the runner once the query stopped) waits for the
    one in flight. Nothing runs behind by default."""

    failure: BaseException | None = None
    failed_behind: BaseException | None = None
    on_first_batch: Callable[[], None] | None = None
    entered_batch: bool = False

    def process_batch(self, batch: Any, batch_id: int) -> None:
        """One micro-batch; a failure is kept so the runner can report it as raised."""
        if not self.entered_batch:
            self.entered_batch = True
            if self.on_first_batch is not None:
                self.on_first_batch()
        try:
            self._process_batch(batch, batch_id)
        except BaseException as error:
            self.failure = error
            self._after_failure()
            raise
        finally:
            memory_release.release_memory()

    def _process_batch(self, batch: Any, batch_id: int) -> None:
        raise NotImplementedError

    def settle_commits(self) -> None:
        """Wait for a commit behind the stopped query (none by default)."""

    def _after_failure(self) -> None:
        """What a failed batch leaves to clean up (nothing by default)."""
