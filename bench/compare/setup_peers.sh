#!/usr/bin/env bash
# Creates the peers' virtual environments from the package registry (idempotent):
#   bench/compare/.venvs/opennmt      OpenNMT-tf 2.32.0 + TensorFlow 2.13.1 (its newest allowed)
#   bench/compare/.venvs/ctranslate2  CTranslate2 4.8.5 + sentencepiece + sacrebleu
# Each venv is built once; a `.complete` stamp holding the pinned requirements
# marks it done, so a rerun with the same pins does nothing and a changed pin rebuilds.
#
# OpenNMT-tf 2.32.0's metadata: extra `tensorflow` -> tensorflow>=2.6,<2.14 and
# tensorflow-text<2.14; tensorflow-addons>=0.16,<0.22; ctranslate2>=3,<4 (used only by
# its own CTranslate2 exporter). TensorFlow 2.13.1 is the newest release it accepts and
# has cp311 wheels; tensorflow-addons 0.21.0 is the release built against 2.13 (cp311);
# TensorFlow 2.13 needs numpy < 1.25. tensorflow-text 2.13.0 has no cp311 wheel, so the
# extra is not installed: tensorflow_text is imported only by OpenNMT-tf's in-graph
# SentencePieceTokenizer, which this protocol does not use (README.md: the peer reads
# files pre-tokenized with the shared SentencePiece model).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="${VENVS:-$HERE/.venvs}"
PYTHON="${PYTHON:-python3.11}"

OPENNMT_PINS=(
  "opennmt-tf==2.32.0"
  "tensorflow==2.13.1"
  "tensorflow-addons==0.21.0"
  "numpy==1.24.3"
  "pyonmttok==1.37.1"
  "sacrebleu==2.4.3"
)
CTRANSLATE2_PINS=(
  "ctranslate2==4.8.5"
  "sentencepiece==0.2.0"
  "sacrebleu==2.4.3"
  "numpy==1.26.4"
  "psutil==5.9.8"
)

make_venv() {  # name, pins...
  local name="$1"; shift
  local dir="$VENVS/$name" stamp
  stamp="$(printf '%s\n' "$@")"
  if [[ -f "$dir/.complete" && "$(cat "$dir/.complete")" == "$stamp" ]]; then
    echo "$name: up to date ($dir)"
    return
  fi
  echo "$name: creating $dir"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --quiet --upgrade pip
  "$dir/bin/pip" install --quiet "$@"
  "$dir/bin/pip" check || true  # report, do not fail: see the pins above
  printf '%s' "$stamp" > "$dir/.complete"
}

mkdir -p "$VENVS"
make_venv opennmt "${OPENNMT_PINS[@]}"
make_venv ctranslate2 "${CTRANSLATE2_PINS[@]}"

"$VENVS/opennmt/bin/python" - <<'PY'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf, opennmt, pyonmttok
print(f"opennmt: opennmt-tf {opennmt.__version__}, tensorflow {tf.__version__}, "
      f"pyonmttok {pyonmttok.__version__}")
PY
"$VENVS/ctranslate2/bin/python" -c \
  "import ctranslate2, sentencepiece; print('ctranslate2:', ctranslate2.__version__, \
'sentencepiece', sentencepiece.__version__)"
