"""The translation path: beam search through the real (tiny, random-weight) model.

Random weights almost never emit EOS, so the tests that need finished
hypotheses of varied lengths scale up the EOS row of the shared embedding
(conftest.py's `eos_prone_model`): its logit then has a larger spread and wins at some
steps depending on the context. The search and the model code are untouched.
"""

import random

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import EOS_ID, PAD_ID, DecodeConfig
from tf_transformer.cli import attention_plot
from tf_transformer.search.beam_search import beam_search
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.decoding.compiled_search import FIRST_CACHE_LENGTH
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer.model import cache as caches
from tf_transformer.model.transformer import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir
from decoding_fixtures import SENTENCES, translator


def _one_layer(model_dir, **overrides):
    """The model of `model_dir`'s config with one layer each side (and `overrides`),
    seeded random weights: for the tests about lengths, which trace their own search
    (Keras draws initializer seeds from Python's and NumPy's generators)."""
    config = ModelDir(model_dir).read_config().model
    random.seed(0)
    np.random.seed(0)
    return build_model(config.__class__(**{**config.__dict__, "num_layers": 1, **overrides}))


@pytest.fixture(scope="module")
def eos_prone(beam4):
    """conftest.py's beam 4, nbest 2 over the EOS-prone model: one search per batch (splits:
    the parallel-search test), outputs up to source + 20 tokens. Its searches, traced once,
    serve the scoring and alignment tests too."""
    return beam4


@pytest.fixture(scope="module")
def sources(eos_prone):
    return eos_prone.source_ids(tf.constant(SENTENCES)).numpy()


def _source_lengths(source):
    return (np.asarray(source) != PAD_ID).sum(axis=1)


@pytest.fixture(scope="module")
def uncached_search(eos_prone, sources):
    """(source, the search's arguments, the search over full forward passes without a
    cache) for 3 sentences, outputs up to min(source length, 6) + 4 tokens."""
    model = eos_prone.model
    source = tf.constant(sources[:3])
    max_lengths = tf.constant(np.minimum(_source_lengths(source), 6) + 4, tf.int32)
    args = dict(vocab_size=model.vocab_size, beam_size=4, alpha=0.6, max_lengths=max_lengths,
                nbest=4)

    def uncached(ids, step, cache):
        logits = model({"source": cache["source"], "target_in": ids[:, :step + 1]})
        return logits[:, -1], cache

    return source, args, beam_search(uncached, {"source": source}, **args)


@pytest.mark.parametrize("kind", ["fixed", "growing", "chunked"])
def test_cached_and_uncached_decoding_give_identical_outputs(eos_prone, uncached_search, kind,
                                                             monkeypatch):
    """The cached search runs as a graph (Grappler's rewrites included: they once merged
    the chunked cache's buffers), the chunked cache over several chunks of 3."""
    monkeypatch.setattr(caches.ChunkedCache, "CHUNK", 3)
    model = eos_prone.model
    source, args, full = uncached_search
    empty = {"growing": caches.growing(), "chunked": caches.chunked(),
             "fixed": caches.fixed(int(tf.reduce_max(args["max_lengths"])))}[kind]

    @tf.function(autograph=False)
    def search(source):
        cache = model.initial_cache(model.encode(source), source, empty)
        return beam_search(model.decode_step, cache, **args)

    cached = search(source)
    np.testing.assert_array_equal(cached.ids.numpy(), full.ids.numpy())
    np.testing.assert_array_equal(cached.lengths.numpy(), full.lengths.numpy())
    np.testing.assert_allclose(cached.scores.numpy(), full.scores.numpy(), rtol=1e-5)
    assert (full.ids.numpy() == EOS_ID).any()  # some hypotheses finished by EOS


def test_a_batch_gives_what_each_sentence_gives_alone(eos_prone, sources):
    batch = eos_prone.translate_ids(tf.constant(sources))
    lengths = batch["lengths"].numpy()
    assert len(set(lengths[:, 0])) > 2  # varied lengths, some stopping early
    for i, row in enumerate(sources):
        alone = eos_prone.translate_ids(tf.constant(row[row != PAD_ID][np.newaxis]))
        width = alone["ids"].shape[2]
        np.testing.assert_array_equal(batch["ids"].numpy()[i, :, :width], alone["ids"].numpy()[0])
        assert (batch["ids"].numpy()[i, :, width:] == PAD_ID).all()
        np.testing.assert_array_equal(lengths[i], alone["lengths"].numpy()[0])
        np.testing.assert_allclose(batch["scores"].numpy()[i], alone["scores"].numpy()[0],
                                   rtol=1e-5)


@pytest.fixture(scope="module")
def one_search(eos_prone, sources):
    """24 sentences in mixed order and their outputs in one search over the batch."""
    order = np.random.default_rng(0).permutation(3 * len(sources))
    batch = tf.constant(np.concatenate([sources] * 3)[order])
    return batch, eos_prone.translate_ids(batch)


def test_parallel_searches_give_one_searchs_outputs_in_input_order(eos_prone, one_search):
    """24 sentences in mixed order, split over 2 interleaved searches (the default
    parallel_searches; any count runs the same `_parallel_search`), equal one search
    over the batch: ids, lengths, scores, nbest 2."""
    parts = 2
    batch, expected = one_search
    split = Translator(eos_prone.model, eos_prone.tokenizer,
                       DecodeConfig(beam_size=4, nbest=2, extra_length=eos_prone.extra_length,
                                    parallel_searches=parts),
                       max_source_length=64)
    assert len(set(expected["lengths"].numpy()[:, 0])) > 2
    via_signature = split.translate_ids(batch)  # 24 >= parts * 8: the split branch
    alpha, extra = tf.constant(split.alpha), tf.constant(split.extra_length)
    # Eagerly: its searches run the loop function the signature traced (a graph of its own
    # would be optimised with two more copies of the loop).
    direct = split._parallel_search(batch, alpha, extra, 2)
    for got in (via_signature, direct._asdict()):
        np.testing.assert_array_equal(got["ids"].numpy(), expected["ids"].numpy())
        np.testing.assert_array_equal(got["lengths"].numpy(), expected["lengths"].numpy())
        np.testing.assert_allclose(got["scores"].numpy(), expected["scores"].numpy(), rtol=1e-5)


def test_alpha_makes_outputs_longer(eos_prone, sources):
    means = []
    for alpha in (0.0, 0.6, 1.5, 3.0):
        out = eos_prone.translate_ids(tf.constant(sources), alpha=alpha)
        means.append(out["lengths"].numpy()[:, 0].mean())
    assert all(a <= b for a, b in zip(means, means[1:])), means
    assert means[-1] > means[0], means


def test_eos_ends_every_hypothesis_and_nothing_follows(eos_prone, sources):
    out = eos_prone.translate_ids(tf.constant(sources), extra_length=20)
    ids, lengths = out["ids"].numpy(), out["lengths"].numpy()
    max_lengths = _source_lengths(sources) + 20
    scores = out["scores"].numpy()
    assert (np.diff(scores, axis=1) <= 0).all()  # n-best sorted
    for i in range(len(sources)):
        for j in range(ids.shape[1]):
            n = lengths[i, j]
            assert 1 <= n <= max_lengths[i]
            assert EOS_ID not in ids[i, j, :n - 1] and PAD_ID not in ids[i, j, :n]
            assert ids[i, j, n - 1] == EOS_ID or n == max_lengths[i]
            assert (ids[i, j, n:] == PAD_ID).all()
    assert (ids == EOS_ID).sum() > len(sources)  # EOS is actually exercised


def test_maximum_length_is_source_length_plus_extra_length(tiny_model_dir, sources):
    # Random weights: runs to the limit. One search per batch: one copy of the loop to trace.
    decoder = translator(_one_layer(tiny_model_dir), tiny_model_dir, beam_size=2,
                         parallel_searches=1)
    source_lengths = _source_lengths(sources)
    out = decoder.translate_ids(tf.constant(sources), extra_length=7)
    lengths = out["lengths"].numpy()[:, 0]
    assert (lengths <= source_lengths + 7).all()
    assert (lengths == source_lengths + 7).sum() >= len(sources) - 1
    assert out["ids"].shape[2] == source_lengths.max() + 7
    # The default (DecodeConfig.extra_length = 50) without the override.
    assert decoder.translate_ids(tf.constant(sources[:1]))["ids"].shape[2] == source_lengths[0] + 50


def test_learned_positions_cap_the_output_length(tiny_model_dir):
    tokenizer = Tokenizer(f"{tiny_model_dir}/{model_dir_lib.VOCAB_FILE}")
    model = _one_layer(tiny_model_dir, positions="learned", max_positions=24)
    decoder = Translator(model, tokenizer, DecodeConfig(beam_size=1, parallel_searches=1),
                        max_source_length=64)
    assert decoder.max_source_length == 24
    out = decoder.translate(tf.constant([" ".join(["word"] * 100), "Fonts"]))
    assert out["length"].numpy().max() <= 24


def test_text_api_handles_empty_bad_and_long_inputs(eos_prone):
    text = tf.constant([b"", b"   ", b"Fonts", b"bad \xff\xfe bytes", " ".join(["word"] * 5000).encode()])
    out = eos_prone.translate(text)
    assert out["translation"].shape == [5] and out["score"].shape == [5]
    assert list(out["translation"].numpy()[:2]) == [b"", b""]
    assert list(out["score"].numpy()[:2]) == [0.0, 0.0]
    assert out["length"].numpy()[4] <= 64 + eos_prone.extra_length  # source truncated to 64
    nbest = eos_prone.translate_nbest(text)
    assert nbest["translations"].shape == [5, 2] and nbest["scores"].shape == [5, 2]
    assert nbest["translations"].numpy()[2, 0] == out["translation"].numpy()[2]
    empty = eos_prone.translate(tf.constant([], tf.string))
    assert empty["translation"].shape == [0] and empty["score"].shape == [0]
    assert eos_prone.translate_nbest(tf.constant([], tf.string))["translations"].shape == [0, 2]


def test_compiled_search_gives_the_graph_paths_outputs(tiny_model_dir, eos_prone_model,
                                                       eos_prone):
    """jit_compile pads the source to a compiled shape: outputs must not change, through the
    ids and the text signatures. One sentence (10 tokens -> 16) with extra_length 30: its
    hypotheses end by EOS past FIRST_CACHE_LENGTH, on the grown cache, and the ids are cut
    back to the graph path's width; an empty batch. (Batches padded with filler rows and
    their capacity stages: test_compiled_search.py.)"""
    compiled = translator(eos_prone_model, tiny_model_dir, beam_size=4, nbest=2, jit_compile=True)
    text = tf.constant(SENTENCES[1:2])
    one = eos_prone.source_ids(text)
    assert one.shape == [1, 10]
    graph = eos_prone.translate_ids(one, extra_length=30)
    xla = compiled.translate_ids(one, extra_length=30)
    assert xla["ids"].shape == graph["ids"].shape == [1, 2, 40]
    np.testing.assert_array_equal(xla["ids"].numpy(), graph["ids"].numpy())
    np.testing.assert_array_equal(xla["lengths"].numpy(), graph["lengths"].numpy())
    np.testing.assert_allclose(xla["scores"].numpy(), graph["scores"].numpy(), rtol=1e-4)
    lengths = graph["lengths"].numpy()
    assert FIRST_CACHE_LENGTH < lengths.min() and lengths.max() < 40  # ended by EOS
    xla_text = compiled.translate_nbest(text, extra_length=30)  # the same compiled shape
    graph_text = eos_prone.translate_nbest(text, extra_length=30)
    np.testing.assert_array_equal(xla_text["translations"].numpy(),
                                  graph_text["translations"].numpy())
    np.testing.assert_allclose(xla_text["scores"].numpy(), graph_text["scores"].numpy(),
                               rtol=1e-4)
    empty = compiled.translate_nbest(tf.constant([], tf.string))
    assert empty["translations"].shape == [0, 2]


def test_text_path_equals_ids_path(eos_prone, sources):
    ids = eos_prone.translate_ids(tf.constant(sources))
    text = eos_prone.translate_nbest(tf.constant(SENTENCES))
    expected = eos_prone.tokenizer.detokenize(tf.reshape(ids["ids"], [len(SENTENCES) * 2, -1]))
    np.testing.assert_array_equal(text["translations"].numpy().reshape(-1), expected.numpy())
    np.testing.assert_allclose(text["scores"].numpy(), ids["scores"].numpy(), rtol=1e-6)
    sorted_batches = translate_sentences(eos_prone, SENTENCES, batch_size=3, nbest=True)
    assert [r.texts for r in sorted_batches] == [
        [t.decode() for t in row] for row in text["translations"].numpy()]


def test_attention_maps_record_the_forward_pass(eos_prone, sources):
    model = eos_prone.model
    source = tf.constant(sources[:2, :12])  # row 0 is padded, row 1 is cut (no EOS: fine here)
    target_in = tf.constant([[2, 40, 41, 42], [2, 50, 51, 0]], tf.int32)
    maps = attention_plot.attention_maps(model, source, target_in)
    assert maps["encoder_self"].shape == (2, 2, 4, 12, 12)
    assert maps["decoder_self"].shape == (2, 2, 4, 4, 4)
    assert maps["decoder_cross"].shape == (2, 2, 4, 4, 12)
    for weights in maps.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    padded = sources[0, :12] == PAD_ID
    assert padded.any() and (maps["decoder_cross"][:, 0][..., padded] < 1e-6).all()
    assert np.triu(maps["decoder_self"][0, 0, 0], k=1).max() < 1e-6  # causal
    assert "attention_weights" not in model.decoder.layers[0].cross_attention.__dict__

