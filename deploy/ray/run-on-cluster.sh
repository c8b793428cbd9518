#!/usr/bin/env bash
# Scores one day of fraud_scoring_job with its shards on a Ray cluster; this process is the driver.
#
#   deploy/ray/run-on-cluster.sh 2026-03-01 ray://ray-head.internal:10001  # Ray Client
#   deploy/ray/run-on-cluster.sh 2026-03-01 auto                           # on a node
#
# "auto" is the cluster this node belongs to: run it on the head, in the image's copy of the
# repository (`ray attach deploy/ray/cluster.yaml`, or `kubectl exec` into the head pod).
#
# Needs the same image or versions as the cluster (Python 3.11, nightshift[ray], ray==2.60.0;
# ray[client] for ray://) and NIGHTSHIFT_DATA_ROOT=s3://...: the workers write shard files to the
# partition's staging area, so it must be storage that driver and workers share.
# NIGHTSHIFT_RAY_WORKERS, NIGHTSHIFT_RAY_GPUS_PER_WORKER and NIGHTSHIFT_RAY_CPUS_PER_WORKER may be
# set beforehand (defaults below). With DAGSTER_HOME at the deployment's instance the run shows
# in the UI, and the daemon's run retries relaunch it through the instance's launcher (ECS), whose
# task must then set the same variables. Otherwise run the same command again: it resumes from the
# partition's progress file, and finished shards are not recomputed.
set -euo pipefail

usage() { echo "usage: $0 YYYY-MM-DD RAY_ADDRESS (ray://HOST:10001 or auto)" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
date=$1 address=$2
[[ $date =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || usage
[[ $address == auto || $address == ray://* ]] || usage
if [[ ${NIGHTSHIFT_DATA_ROOT:-} != s3://* ]]; then
    echo "NIGHTSHIFT_DATA_ROOT must be s3://bucket/prefix (shared by driver and workers)" >&2
    exit 2
fi
: "${AWS_REGION:?set AWS_REGION to the region of the data root}"

export NIGHTSHIFT_ENV=${NIGHTSHIFT_ENV:-aws}
export NIGHTSHIFT_EXECUTOR=ray
export NIGHTSHIFT_RAY_ADDRESS=$address
# One shard actor per GPU worker; more actors than GPUs wait for the autoscaler (max_workers).
export NIGHTSHIFT_RAY_WORKERS=${NIGHTSHIFT_RAY_WORKERS:-8}
export NIGHTSHIFT_RAY_GPUS_PER_WORKER=${NIGHTSHIFT_RAY_GPUS_PER_WORKER:-1}
export NIGHTSHIFT_RAY_CPUS_PER_WORKER=${NIGHTSHIFT_RAY_CPUS_PER_WORKER:-1}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

cd "$(dirname "$0")/../.."
# Fail now, not after a night on one machine, if this environment's resource map does not take
# the executor from the environment.
python - <<'EOF'
import os

from orchestration.resources import build_resources

env = os.environ["NIGHTSHIFT_ENV"]
inference = build_resources(env)["inference"]
if (inference.executor, inference.ray_address) != ("ray", os.environ["NIGHTSHIFT_RAY_ADDRESS"]):
    raise SystemExit(
        f"NIGHTSHIFT_ENV={env}: the inference resource has executor={inference.executor!r}, "
        f"ray_address={inference.ray_address!r}; its resource map ignores NIGHTSHIFT_EXECUTOR"
    )
EOF
exec dagster job execute -m orchestration.definitions -j fraud_scoring_job \
    --tags "{\"dagster/partition\": \"$date\"}"
