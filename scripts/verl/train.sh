#!/usr/bin/env bash
# Train a balcaprl recipe with verl: one 8-GPU node, or several (Ray cluster started first, see
# ray_cluster.sh). Run on the head node from the repository root:
#
#   scripts/verl/train.sh configs/qwen2_5_vl_3b.yaml                 # 1 node x 8 GPUs
#   NNODES=4 scripts/verl/train.sh configs/qwen2_5_vl_7b.yaml        # 4 nodes x 8 GPUs
#   DRY_RUN=1 scripts/verl/train.sh configs/qwen2_5_vl_3b.yaml       # print the verl overrides only
#
# Extra arguments go to `balcaprl verl launch`: recipe overrides (data.path=..., run.output_dir=...) and
# `--verl-override KEY=VALUE` for raw verl settings (e.g. actor_rollout_ref.rollout.gpu_memory_utilization=0.6).
# Steps: export the dataset for verl once (skipped when DATA/verl/export.json exists), then render the
# recipe and start verl (python -m balcaprl.train.verl_backend.main ...).
set -euo pipefail

recipe="${1:?usage: train.sh RECIPE.yaml [balcaprl verl launch arguments...]}"
shift
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
BALCAPRL="${BALCAPRL:-balcaprl}"

args=(verl launch "$recipe" "$@" --nnodes "$NNODES" --gpus-per-node "$GPUS_PER_NODE")
if [[ -n "${DRY_RUN:-}" ]]; then
  exec "$BALCAPRL" "${args[@]}" --dry-run
fi

if (( NNODES > 1 )); then
  # verl joins the running cluster (ray.init connects to it); check it has every node's GPUs.
  gpus=$(python3 -c "import ray; ray.init(address='auto', log_to_driver=False); print(int(ray.cluster_resources().get('GPU', 0)))")
  if (( gpus < NNODES * GPUS_PER_NODE )); then
    echo "the Ray cluster has $gpus GPUs, the run needs $((NNODES * GPUS_PER_NODE)); start the workers first (ray_cluster.sh)" >&2
    exit 1
  fi
fi

# The resolved recipe (`balcaprl train --print-config`) says where the data and the model are; that call
# gets the recipe and its overrides, not the flags only `verl launch` takes.
recipe_args=()
skip_value=0
for arg in "$@"; do
  if (( skip_value )); then skip_value=0; continue; fi
  case "$arg" in
    --verl-override|--verl-data|--nnodes|--gpus-per-node) skip_value=1 ;;
    --verl-override=*|--verl-data=*|--nnodes=*|--gpus-per-node=*|--dry-run) ;;
    *) recipe_args+=("$arg") ;;
  esac
done
resolved=$("$BALCAPRL" train "$recipe" ${recipe_args[@]+"${recipe_args[@]}"} --print-config)
data=$(python3 -c "import sys, yaml; print(yaml.safe_load(sys.stdin)['data']['path'])" <<<"$resolved")
if [[ ! -f "$data/verl/export.json" ]]; then
  model=$(python3 -c "import sys, yaml; print(yaml.safe_load(sys.stdin)['model']['path'])" <<<"$resolved")
  "$BALCAPRL" verl export --data "$data" --out "$data/verl" --tokenizer "$model"
fi
exec "$BALCAPRL" "${args[@]}"
