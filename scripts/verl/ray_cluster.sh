#!/usr/bin/env bash
# Start or stop the Ray cluster a multi-node verl run uses. Run on every machine, head first:
#
#   scripts/verl/ray_cluster.sh head                 # on the head node (prints the address to join)
#   scripts/verl/ray_cluster.sh worker HEAD_IP       # on each other node
#   scripts/verl/ray_cluster.sh status               # on the head: every node and GPU listed?
#   scripts/verl/ray_cluster.sh stop                 # on every node, when done
#
# Every node needs the same software (this repo installed with `pip install -e '.[verl]'` plus verl's
# GPU stack: `pip install 'verl[vllm]'`), the same paths for the dataset, its verl export and the run
# folder (a shared filesystem), and the judge's API key variable in the environment of `ray start`
# (Ray workers inherit it). Environment knobs: RAY_PORT (6379), DASHBOARD_PORT (8265),
# GPUS_PER_NODE (all visible GPUs).
set -euo pipefail

RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
GPUS_PER_NODE="${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
# Also set by `balcaprl verl launch` for the job (Ray runtime env); exporting it here makes
# every Ray worker on this node import the balcaprl plugin even for jobs started by hand.
export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:-balcaprl.train.verl_backend.plugin}"

case "${1:-}" in
  head)
    ray start --head --port="$RAY_PORT" --dashboard-host=0.0.0.0 --dashboard-port="$DASHBOARD_PORT" \
      --num-gpus="$GPUS_PER_NODE"
    echo "head started; on every other node run: scripts/verl/ray_cluster.sh worker $(hostname -I | awk '{print $1}')"
    ;;
  worker)
    head_ip="${2:?usage: ray_cluster.sh worker HEAD_IP}"
    ray start --address="$head_ip:$RAY_PORT" --num-gpus="$GPUS_PER_NODE"
    ;;
  status)
    ray status
    ;;
  stop)
    ray stop
    ;;
  *)
    echo "usage: $0 head | worker HEAD_IP | status | stop" >&2
    exit 2
    ;;
esac
