"""Every run tag nightshift sets or reads, named once; and the run priorities the queue acts on."""

# --- Dagster's own tags -------------------------------------------------------------------------

PARTITION_TAG = "dagster/partition"
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
PARENT_RUN_TAG = "dagster/parent_run_id"
# How many times the daemon relaunched this run's lineage so far (0 on the first attempt).
RETRY_NUMBER_TAG = "dagster/retry_number"
# A run's own relaunch budget; overrides the instance's run_retries.max_retries.
MAX_RETRIES_TAG = "dagster/max_retries"
# The daemon retries a run that failed in a step only when this tag says so; nightshift sets it
# on interruptions alone, so errors never spend the interruption budget at run level.
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"

# --- Priorities (deploy/local/dagster.yaml holds the queue's limits) ----------------------------

PRIORITY_TAG = "dagster/priority"
# The queue launches higher numbers first; backfills carry none (0), so a re-score that a new
# landing partition triggered, and the nightly schedule, overtake a month-long backfill.
SENSOR_PRIORITY = {PRIORITY_TAG: "10"}
SCHEDULE_PRIORITY = {PRIORITY_TAG: "5"}
# Set explicitly on the runs nightshift requests as backfills (re-scoring stale days).
BACKFILL_PRIORITY = {PRIORITY_TAG: "0"}

# --- nightshift's tags --------------------------------------------------------------------------

# GPU-heavy jobs name the GPU they use; the run queue admits one run per distinct value.
GPU_TAG = "nightshift/gpu"
GPU_TAGS = {GPU_TAG: "0"}

# Set on a run whose step was interrupted, with the partition's interruption count so far.
INTERRUPTED_TAG = "nightshift/interrupted"
INTERRUPTIONS_TAG = "nightshift/interruptions"
# In-place retries after soft interruptions, so error retries can be told apart from them.
SOFT_INTERRUPTIONS_TAG = "nightshift/soft_interruptions"

# On a run of Dagster's hidden asset job (what the UI launches from an asset's page), the named
# pipeline jobs holding its assets: the run list shows `__ASSET_JOB` and the partition pane
# "Job: None" for such runs; this tag says which pipeline the run did the work of.
PIPELINE_TAG = "nightshift/pipeline"

# Which capacity a run was moved to ("on-demand"): the UI's run filter, the run queue's
# on-demand limit (deploy/aws/dagster.yaml) and ECS cost allocation read it.
CAPACITY_TAG = "nightshift/capacity"
ON_DEMAND = "on-demand"
# JSON that EcsRunLauncher applies over the instance's run_task_kwargs at launch.
RUN_TASK_KWARGS_TAG = "ecs/run_task_kwargs"

# What launched a run from a landing partition, and which files it was asked to read.
TRIGGER_TAG = "nightshift/trigger"
DATASET_TAG = "nightshift/dataset"
LANDING_FINGERPRINT_TAG = "nightshift/landing_fingerprint"

# The deadline-aware policy's reason for the capacity a run was put on, one line (see
# policy/deadline.py), e.g. "on-demand: about 2.1 h of work left, 1.8 h to 07:00 (...)".
CAPACITY_REASON_TAG = "nightshift/capacity_reason"
# A run's own ready-by, an ISO date-time in UTC: overrides the asset's daily ready-by time for
# this run and its retries (a one-off deadline, or a test's).
READY_BY_TAG = "nightshift/ready_by"

# Which model version a scoring run uses: "champion" (absent: the default) or
# "champion_on_day", the version that was champion on the days it scores (assets/staleness.py).
MODEL_CHOICE_TAG = "nightshift/model_choice"
# On a run that re-scores a stale day: the version that had scored it.
STALE_VERSION_TAG = "nightshift/stale_version"
