"""The pipelines' executor: Dagster's in-process executor, except that a step stopped by SIGTERM
or SIGINT ends the run instead of being retried in the same process.

With a retry policy on the step, Dagster turns an interruption into an in-process retry: the
run worker then runs the step again and finishes the run as if nothing happened, so `dagster
dev` stopped with Ctrl-C (or SIGTERM) stayed alive until the run ended. The process is being
asked to go: the run fails as interrupted, and the daemon's run retries relaunch it (scoring
steps resume from their shards, see assets/checkpointing.py). Errors keep their in-process
retries, and so does a soft interruption (SIGUSR1), which nightshift raises as a RetryRequested.
"""

from __future__ import annotations

from collections.abc import Iterator

from dagster import DagsterEventType, Executor, executor, in_process_executor

# How an interruption shows in the error chain of a step's retry event.
INTERRUPTION_ERRORS = frozenset({"DagsterExecutionInterruptedError", "KeyboardInterrupt"})


def interrupted(error) -> bool:
    """Whether an error (a SerializableErrorInfo) was caused by SIGTERM/SIGINT."""
    while error is not None:
        if error.cls_name in INTERRUPTION_ERRORS:
            return True
        error = error.cause
    return False


class LeaveOnInterruption(Executor):
    """Runs the plan with `inner`; stops at the first step retry that an interruption caused."""

    def __init__(self, inner: Executor):
        self.inner = inner

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator:
        for event in self.inner.execute(plan_context, execution_plan):
            yield event
            if event.event_type == DagsterEventType.STEP_UP_FOR_RETRY and interrupted(
                event.event_specific_data.error
            ):
                # Dagster fails the run as interrupted, as it does for a signal between steps.
                raise KeyboardInterrupt(f"step {event.step_key} interrupted: not retried here")


@executor(name="in_process", config_schema=in_process_executor.config_schema)
def leave_on_interruption_executor(init_context) -> Executor:
    return LeaveOnInterruption(in_process_executor.executor_creation_fn(init_context))
