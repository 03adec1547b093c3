#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2
$PY -m tf_transformer.summary --preset=tiny --vocab_size=8000
