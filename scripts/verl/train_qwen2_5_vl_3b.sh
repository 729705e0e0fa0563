#!/usr/bin/env bash
# BalCapRL main-results recipe for Qwen2.5-VL-3B on verl (configs/qwen2_5_vl_3b.yaml; rendered verl
# settings for reference: configs/verl/qwen2_5_vl_3b.1x8.overrides and .4x8.overrides).
#
#   scripts/verl/train_qwen2_5_vl_3b.sh                    # one node, 8 GPUs
#   NNODES=4 scripts/verl/train_qwen2_5_vl_3b.sh           # 4 nodes x 8 GPUs (ray_cluster.sh first)
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/verl/train.sh configs/qwen2_5_vl_3b.yaml "$@"
