#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded English-German corpus:
# train the tiny preset, average checkpoints, export a SavedModel, translate
# held-out sentences through it (TensorFlow + tensorflow-text only), evaluate.
# Rerunning continues training from the checkpoints in $RUN for another $MINUTES.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=1
DATA=data/libreoffice-help.en-de
RUN=${DEMO_DIR:-runs/demo}
MINUTES=${DEMO_MINUTES:-8}

echo "== 1/5 train: tiny preset, 4000-piece vocabulary, $MINUTES minutes -> $RUN"
$PY -m tf_transformer.train --train_data=$DATA/train.tsv --dev_data=$DATA/dev.tsv \
  --model_dir=$RUN --preset=tiny --vocab_size=4000 \
  --max_length=128 --max_minutes="$MINUTES" --max_steps=1000000 \
  --log_every=100 --checkpoint_minutes=1 --dev_bleu_sentences=0 2>/dev/null

echo "== 2/5 average the last 2 checkpoints -> $RUN/averaged"
$PY -m tf_transformer.average_checkpoints --model_dir=$RUN --num_last=2 \
  --output=$RUN/averaged 2>/dev/null

echo "== 3/5 export a SavedModel (tokenization and beam search inside) -> $RUN/export"
$PY -m export --model_dir=$RUN/averaged --export_dir=$RUN/export 2>/dev/null
VERSION=$(ls $RUN/export | grep -E '^[0-9]+$' | sort -n | tail -1)

echo "== 4/5 translate held-out test sentences with the SavedModel (no project code)"
head -8 $DATA/test.tsv | cut -f1 > $RUN/demo_input.txt
head -8 $DATA/test.tsv | cut -f2 > $RUN/demo_reference.txt
$PY -I export/serving/translate_saved_model.py --saved_model=$RUN/export/$VERSION \
  < $RUN/demo_input.txt > $RUN/demo_output.txt 2>/dev/null
paste $RUN/demo_input.txt $RUN/demo_output.txt $RUN/demo_reference.txt |
  awk -F'\t' '{printf "  en:  %s\n  out: %s\n  ref: %s\n\n", $1, $2, $3}'

echo "== 5/5 evaluate on the first 300 test pairs"
$PY -m tf_transformer.evaluate --model_dir=$RUN/averaged --data=$DATA/test.tsv \
  --max_sentences=300 2>/dev/null
