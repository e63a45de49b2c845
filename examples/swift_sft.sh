#!/usr/bin/env bash
# ms-swift's own `swift sft`, its M-RoPE templates taking their positions from mmrope: one flag,
# --external_plugins, with the file mmrope ships for it. Any other argument is ms-swift's own.
#
#   bash examples/swift_sft.sh Qwen/Qwen2.5-VL-7B-Instruct my_data.jsonl output/ --padding_free true
#
# The tests run it (tests/trainers/test_launchers.py) on a tiny random checkpoint, on CPU.
set -euo pipefail
model=${1:?a model directory or hub id}
dataset=${2:?a dataset (a .jsonl of messages and images, or a dataset id)}
output=${3:?an output directory}
shift 3
exec swift sft --model "$model" --dataset "$dataset" --output_dir "$output" \
    --external_plugins "$(python -m mmrope_core.integrations.swift)" "$@"
