"""The two retry budgets: errors in user code, and interruptions (spot reclaims, node drains).

Dagster counts both as retries of the same step; nightshift keeps them apart (see
assets/checkpointing.py), so each has its own number here and nowhere else.
"""

from dagster import Backoff, Jitter, RetryPolicy

from policy.tags import MAX_RETRIES_TAG

# Errors in user code get a small budget with backoff, then fail loudly. Errors that a retry
# cannot fix (missing or malformed landing data, no trained model, a model version whose files
# are missing or damaged, a file where a folder must be, a folder it may not write) raise
# Failure(allow_retries=False) at once, naming the path and the fix (assets/errors.py).
ERROR_RETRY_POLICY = RetryPolicy(
    max_retries=2, delay=5, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)

# Interruptions have their own, larger budget: the daemon relaunches an interrupted run up to
# this many times, and the scoring step stops asking for relaunches past it. The inference
# resource's `interruption_budget` defaults to it, the pipeline jobs' tag carries it, and both
# instance configs' `run_retries.max_retries` equal it (tests/test_retry_budgets.py checks).
INTERRUPTION_BUDGET = 5

# On every pipeline job: the per-run tag overrides the instance's run_retries.max_retries.
INTERRUPTION_RETRY_TAGS = {MAX_RETRIES_TAG: str(INTERRUPTION_BUDGET)}
