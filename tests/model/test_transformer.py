"""Properties of section 3 checked on tiny models."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import presets
from tf_transformer.config import BOS_ID, ConfigError, ModelConfig
from tf_transformer.model import build_model
from tf_transformer.model_dir import ModelDir

TINY = ModelConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.0)


def _batch(seed=0, batch=3, s=7, t=6, vocab=40):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, vocab, size=(batch, s))
    target = rng.integers(4, vocab, size=(batch, t))
    target[:, 0] = BOS_ID
    source[1, 4:] = 0  # a shorter source
    return tf.constant(source, tf.int32), tf.constant(target, tf.int32)


@pytest.mark.parametrize("overrides", [{}, {"pre_norm": True}, {"positions": "learned"},
                                       {"share_embeddings": False, "source_vocab_size": 50}])
def test_causality(overrides):
    model = build_model(TINY.__class__(**{**TINY.__dict__, **overrides}))
    source, target = _batch()
    logits = model({"source": source, "target_in": target}).numpy()
    changed = []  # variant i: the target with positions after i redrawn
    for i in range(target.shape[1] - 1):
        variant = target.numpy().copy()
        variant[:, i + 1:] = np.random.default_rng(i).integers(4, 40, size=variant[:, i + 1:].shape)
        changed.append(variant)
    # Every variant in one pass, stacked on the batch axis (rows never see each other).
    others = model({"source": tf.tile(source, [len(changed), 1]),
                    "target_in": tf.constant(np.concatenate(changed))}).numpy()
    for i, other in enumerate(np.split(others, len(changed))):
        np.testing.assert_allclose(other[:, :i + 1], logits[:, :i + 1], atol=1e-5)
        assert np.abs(other[:, i + 1:] - logits[:, i + 1:]).max() > 1e-3  # the future does change


def test_padding_invariance():
    model = build_model(TINY)
    source, target = _batch()
    logits = model({"source": source, "target_in": target}).numpy()
    padded = tf.pad(source, [[0, 0], [0, 5]])
    logits_padded = model({"source": padded, "target_in": target}).numpy()
    np.testing.assert_allclose(logits_padded, logits, atol=1e-5)
    memory, memory_padded = model.encode(source).numpy(), model.encode(padded).numpy()
    real = source.numpy() != 0
    np.testing.assert_allclose(memory_padded[:, :7][real], memory[real], atol=1e-5)


def test_sinusoid_equals_paper_formula():
    model = build_model(ModelConfig(vocab_size=40, num_layers=1, d_model=16, d_ff=32, num_heads=2))
    table = model.target_embedding.position_table(50).numpy()
    pos = np.arange(50)[:, None]
    i = np.arange(8)[None, :]
    expected = np.zeros((50, 16))
    expected[:, 0::2] = np.sin(pos / 10000 ** (2 * i / 16))
    expected[:, 1::2] = np.cos(pos / 10000 ** (2 * i / 16))
    np.testing.assert_allclose(table, expected, atol=1e-5)
    shifted = model.target_embedding.position_table(5, start_index=17).numpy()
    np.testing.assert_allclose(shifted, expected[17:22], atol=1e-5)


def test_learned_position_table_is_the_weight():
    model = build_model(TINY.__class__(**{**TINY.__dict__, "positions": "learned"}))
    table = model.target_embedding.position_encoding.table.numpy()
    np.testing.assert_array_equal(model.target_embedding.position_table(5, start_index=3).numpy(),
                                  table[3:8])


def test_embedding_scaled_and_shared():
    model = build_model(TINY)
    ids = tf.constant([[5, 9]])
    table = model.target_embedding.token_embedding.embeddings.numpy()
    embedded = model.target_embedding(ids).numpy()
    positions = model.target_embedding.position_table(2).numpy()
    np.testing.assert_allclose(embedded[0], table[[5, 9]] * math.sqrt(32) + positions, atol=1e-5)
    assert model.source_embedding is model.target_embedding
    # The pre-softmax projection is the same matrix, transposed.
    x = tf.random.normal([1, 32])
    np.testing.assert_allclose(model.target_embedding.logits(x).numpy(), x.numpy() @ table.T,
                               rtol=1e-5, atol=1e-5)


@pytest.fixture
def zero_initializers(monkeypatch):
    """The model's random initializers (uniform, normal, Glorot) fill zeros instead: a
    parameter count reads shapes, never values, and drawing tens to hundreds of millions of
    random numbers was most of building a large preset."""
    def zeros(self, shape, dtype=None):
        return keras.ops.zeros(shape, dtype=dtype)

    for initializer in (keras.initializers.RandomUniform, keras.initializers.RandomNormal,
                        keras.initializers.VarianceScaling):  # GlorotUniform's __call__
        monkeypatch.setattr(initializer, "__call__", zeros)


# Not built here: rows D (dropout, label smoothing) have base's architecture, and base and
# big are built and checked against the closed form by test_param_counts_against_table3.
SAME_BUILD = {"base", "big", "d_pdrop0", "d_pdrop02", "d_ls0", "d_ls02"}


@pytest.mark.parametrize("name", [n for n in presets.preset_names() if n not in SAME_BUILD])
def test_built_params_equal_closed_form(name, zero_initializers):
    """Each row's layers (its widths, heads, key and value sizes, positions, norms) at
    most 2 deep: the count of a stack N deep is N layers' (base and big are built whole
    by test_param_counts_against_table3); the rows of 4 to 8 layers took most of the build."""
    config = presets.get_preset(name, vocab_size=1000).model
    config = dataclasses.replace(config, num_layers=min(config.num_layers, 2))
    assert build_model(config).count_params() == presets.closed_form_params(config)


# name: (the built model's weights, counted, as BUILD.md and README give them; Table 3).
TABLE3_PARAMS = {"base": (63_082_496, "63.1", 65), "big": (214_245_376, "214.2", 213)}


@pytest.mark.slow  # builds big: 214M weights (zeros), ~1 GB
@pytest.mark.parametrize("name", TABLE3_PARAMS)
def test_param_counts_against_table3(name, zero_initializers):
    """Every weight of the built model counted, against the paper's Table 3 and against
    presets.closed_form_params (which does not build anything).

    Tolerance 3%: Table 3 rounds to millions and its shared vocabulary is "about 37000"
    BPE tokens, without saying which biases and norms it counts; base sits 2.9% under
    65M (1.9M, ~3,700 vocabulary rows), big 0.6% over 213M. A layer more or fewer, or a
    softmax matrix not shared, moves the count further (one base encoder layer is 3.15M,
    5%; a second 37000 x 512 table 19M, 30%)."""
    config = presets.get_preset(name).model
    assert config.share_embeddings and config.vocab_size == 37000
    model = build_model(config)
    assert model.source_embedding is model.target_embedding  # one table, counted once
    assert not model.non_trainable_weights
    counted = sum(math.prod(w.shape) for w in model.weights)
    ours, ours_millions, paper_millions = TABLE3_PARAMS[name]
    assert counted == ours and f"{counted / 1e6:.1f}" == ours_millions
    assert counted == presets.closed_form_params(config)
    assert abs(counted / 1e6 - paper_millions) / paper_millions < 0.03, counted


def test_rows_d_share_bases_architecture():
    """Why test_built_params_equal_closed_form leaves rows D out: only dropout differs."""
    base = presets.get_preset("base").model
    for name in ("d_pdrop0", "d_pdrop02", "d_ls0", "d_ls02"):
        assert dataclasses.replace(presets.get_preset(name).model, dropout=base.dropout) == base, name


def test_closed_form_against_table3_rows():
    """Every row of Table 3 with a params figure, from the closed form (equal to the
    built count: test_built_params_equal_closed_form), within 7% (c_n2: -6.5%)."""
    for name, paper in presets.PAPER_PARAMS_MILLIONS.items():
        ours = presets.closed_form_params(presets.get_preset(name).model) / 1e6
        assert abs(ours - paper) / paper < 0.07, (name, ours, paper)


def test_serialization_round_trip(tmp_path):
    model = build_model(TINY.__class__(**{**TINY.__dict__, "dropout": 0.1}))
    source, target = _batch()
    expected = model({"source": source, "target_in": target}).numpy()
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded({"source": source, "target_in": target}).numpy(), expected)
    assert loaded.get_config() == model.get_config()
    for layer in (model.encoder.layers[0], model.decoder.layers[0],
                  model.decoder.layers[0].cross_attention, model.target_embedding):
        clone = layer.__class__.from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()


def test_mixed_bfloat16_keeps_logits_and_norms_float32():
    model = build_model(TINY, dtype="mixed_bfloat16")
    source, target = _batch()
    logits = model({"source": source, "target_in": target})
    assert logits.dtype == tf.float32
    assert model.encoder.layers[0].self_attention.qkv_kernel.dtype == "float32"
    full32 = build_model(TINY)
    full32.set_weights(model.get_weights())
    reference = full32({"source": source, "target_in": target}).numpy()
    assert np.abs(logits.numpy() - reference).max() < 0.1 * np.abs(reference).max()


def test_bad_configuration_fails_clearly():
    with pytest.raises(ConfigError, match="not divisible"):
        ModelConfig(d_model=100, num_heads=8)
    with pytest.raises(ConfigError, match="unknown preset"):
        presets.get_preset("huge")
    with pytest.raises(ConfigError, match="positions"):
        ModelConfig(positions="rotary")
    assert ModelConfig(d_model=100, num_heads=8, d_k=16, d_v=16).key_dim == 16


def test_config_json_round_trip(tmp_path):
    config = presets.get_preset("small")
    ModelDir(str(tmp_path)).write_config(config)
    assert ModelDir(str(tmp_path)).read_config() == config
