"""Every character survives: a model whose vocabulary has byte fallback (the default) never
prints <unk>'s "⁇", through the translate binary and through its SavedModel export.

The model is the tiny fixture (1+1 layers, seeded random weights) with a 600-piece
byte-fallback vocabulary of the embedded corpus; the sentences hold characters that corpus
never shows (accented Latin beyond German's, Greek, CJK, emoji) beside ß and é, which its
German has. Without byte fallback they would be <unk> (tests/inputs/test_tokenizer.py). An
untrained model gives <unk> its share of each step's probability (training would teach it
that no target holds <unk>), so only the search keeps it out; a model pushed towards <unk>
is tested in tests/decoding/test_translator_vocabularies.py.
"""

import os

import pytest
import tensorflow as tf
from binary_fixtures import run_main
from model_fixtures import make_model_dir
from saved_model_fixtures import export_model

from tf_transformer.config import UNK_ID
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer import model_dir as model_dir_lib

pytestmark = pytest.mark.slow

UNSEEN = ["Bézier curves: naïve façade", "Straße nach Łódź", "Ωμέγα and the table",
          "漢字かな交じり文", "Emoji 😀🚀 and ✓", "Edit Points in Kraków, São Paulo"]
UNK_TEXT = "\u2047"
DECODE_FLAGS = ["--beam_size=2", "--extra_length=8", "--parallel_searches=1"]


@pytest.fixture(scope="module")
def byte_fallback_model_dir(tmp_path_factory, byte_fallback_model_path):
    with open(byte_fallback_model_path, "rb") as f:
        proto = f.read()
    return make_model_dir(str(tmp_path_factory.mktemp("model") / "bytes"), proto, steps=0,
                          num_layers=1)


def test_no_unk_through_the_translate_binary_and_the_saved_model(byte_fallback_model_dir,
                                                                  tmp_path):
    vocab = Tokenizer(os.path.join(byte_fallback_model_dir, model_dir_lib.VOCAB_FILE))
    assert vocab.byte_fallback  # so the model reads bytes, not <unk>, for these characters
    assert UNK_ID not in vocab.tokenize(tf.constant(UNSEEN)).flat_values.numpy()

    source = tmp_path / "unseen.txt"
    source.write_text("\n".join(UNSEEN) + "\n", encoding="utf-8")
    run = run_main("tf_transformer.translate", [f"--model_dir={byte_fallback_model_dir}",
                                                 f"--input={source}", "--nbest=2", *DECODE_FLAGS])
    assert run["code"] == 0, run["stderr"][-3000:]
    lines = run["stdout"].split("\n")[:-1]  # index<TAB>score<TAB>text
    assert len(lines) == 2 * len(UNSEEN)
    binary = [line.split("\t")[2] for line in lines]
    assert not [text for text in binary if UNK_TEXT in text]

    exported = export_model(byte_fallback_model_dir, str(tmp_path / "export"), *DECODE_FLAGS,
                            "--signatures=translate_nbest", "--warmup_sentences=")
    served = tf.saved_model.load(exported).signatures["translate_nbest"](
        text=tf.constant(UNSEEN))["translations"].numpy()
    texts = [t.decode("utf-8") for row in served for t in row]
    assert not [text for text in texts if UNK_TEXT in text]
    assert texts == binary  # the same graph: the export serves what the binary printed
