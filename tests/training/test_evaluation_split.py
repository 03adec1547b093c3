"""Evaluation split over replicas (2 logical devices here; workers in
test_gpu_path_workers.py): dev loss and dev BLEU equal one device's."""

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from model_fixtures import SAMPLE_LINES, make_model_dir

from tf_transformer.cli import evaluation
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import DecodeConfig
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs import pipeline
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import distribution
from tf_transformer.training.evaluators import dev_loss_fn


def test_bleu_from_summed_statistics_is_the_corpus_bleu():
    hypotheses = ["the cat sat on the mat", "a dog", "no match here at all", "the cat"]
    references = ["the cat sat on a mat", "a dog barked", "something else entirely", "a cat"]
    parts = [evaluation.bleu_statistics(hypotheses[i::3], references[i::3]) for i in range(3)]
    whole = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score
    assert 0 < whole < 100
    assert evaluation.bleu_from_statistics(np.sum(parts, axis=0)) == pytest.approx(whole, abs=1e-9)
    assert not evaluation.bleu_statistics([], []).any()


@pytest.fixture(scope="module")
def one_layer_model_dir(tmp_path_factory, spm_model_path):
    """Seeded random weights of 1+1 layers: each search trace costs half the tiny model's.
    Seed 2: its greedy outputs differ from sentence to sentence and some have several words,
    so their BLEU against themselves is 100 and against each other's near 0 (the outputs of
    seed 1 are one word each: no 4-gram, BLEU 0 whatever the order)."""
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    return make_model_dir(str(tmp_path_factory.mktemp("model") / "one_layer"), proto,
                          seed=2, num_layers=1)


@pytest.mark.slow
def test_two_replicas_evaluate_as_one_device(one_layer_model_dir, small_tokenizer):
    """The model's one-device translations are the references, so the split BLEU is 100
    only if each replica's hypotheses are one device's and meet their own references;
    dev loss of random weights, as one device sums it."""
    loaded = model_dir_lib.load_model(ModelDir(one_layer_model_dir))
    config = ModelDir(one_layer_model_dir).read_config()
    # Greedy, one search loop per trace (neither the beam nor the parallel sub-batch searches
    # are what is split here; a beam's trace costs twice the whole test).
    config = config.replace(decode=DecodeConfig(beam_size=1, extra_length=3, batch_size=4,
                                                 parallel_searches=1))
    translator = Translator(loaded.model, small_tokenizer, config.decode, config.data.max_length)
    sources = SAMPLE_LINES + [line.lower() for line in SAMPLE_LINES[:3]]  # 11: uneven shards
    references = [r.texts[0] for r in translate_sentences(translator, sources, 4)]
    dev = Corpus(sources, references)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with mirrored.scope():  # the trainer's model: mirrored variables
        model = model_dir_lib.load_model(ModelDir(one_layer_model_dir)).model
    shards = distribution.Shards(mirrored)
    assert shards.count == 2 and shards.local == [0, 1]
    split = evaluation.dev_bleu_fn(dev, small_tokenizer, config, batch_size=4, shards=shards)
    assert split(model)["dev_bleu"] == pytest.approx(100.0)
    assert sacrebleu.metrics.BLEU().corpus_score(sources, [references]).score < 50
    misaligned = references[1:] + references[:1]  # what hypotheses met others' would score
    assert sacrebleu.metrics.BLEU().corpus_score(misaligned, [references]).score < 50

    one = dev_loss_fn(pipeline.make_dataset(dev, small_tokenizer, config.data, training=False),
                      config.train.label_smoothing)(loaded.model)
    split = dev_loss_fn(pipeline.dataset_fn(dev, small_tokenizer, config.data, training=False),
                        config.train.label_smoothing, shards)(model)
    assert one["dev_loss"] > 1.0
    assert split["dev_loss"] == pytest.approx(one["dev_loss"], rel=1e-6)
