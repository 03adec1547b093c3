"""model_dir.py on its own: the model-directory contract and averaging.

The fixture writes four checkpoints of a tiny model whose weights are set to
known random values before each save (the manager keeps the last three), so
every loaded or averaged weight can be compared with numpy.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from model_dir_fixtures import assert_weights, mean_weights
from model_fixtures import tiny_config

from tf_transformer.config import Config, ConfigError
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib

STEPS = (10, 20, 30, 40)
KEPT = 3  # the manager's max_to_keep: ckpt-10 is deleted


@pytest.fixture(scope="module")
def vocab_proto(spm_model_path):
    with open(spm_model_path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def config(small_tokenizer):
    return tiny_config(small_tokenizer.vocab_size, num_layers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, config, vocab_proto):
    """(path, {step: [float32 arrays in model.weights order]})."""
    path = str(tmp_path_factory.mktemp("checkpoints") / "model")
    model_dir_lib.prepare_model_dir(path, config, vocab_proto)
    model = build_model(config.model)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), path, max_to_keep=KEPT)
    rng = np.random.default_rng(0)
    weights = {}
    for step in STEPS:
        values = [rng.normal(size=v.shape).astype(np.float32) for v in model.weights]
        for var, value in zip(model.weights, values):
            var.assign(value)
        manager.save(checkpoint_number=step)
        weights[step] = values
    return path, weights


def test_resolve_a_path_a_directory_and_an_empty_directory(model_dir, tmp_path):
    path, _ = model_dir
    assert model_dir_lib.resolve(path) == os.path.join(path, "ckpt-40")
    explicit = os.path.join(path, "ckpt-20")
    assert model_dir_lib.resolve(explicit) == explicit
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        model_dir_lib.resolve(str(tmp_path))
    assert model_dir_lib.checkpoint_paths(str(tmp_path)) == []


def test_checkpoint_paths_and_last_checkpoints_are_oldest_first(model_dir):
    path, _ = model_dir
    kept = [os.path.join(path, f"ckpt-{s}") for s in STEPS[-KEPT:]]
    assert model_dir_lib.checkpoint_paths(path) == kept
    assert model_dir_lib.last_checkpoints(path, 2) == kept[-2:]
    assert model_dir_lib.last_checkpoints(path, KEPT) == kept
    with pytest.raises(ValueError, match=f"keeps {KEPT} checkpoints, fewer than {KEPT + 1}"):
        model_dir_lib.last_checkpoints(path, KEPT + 1)


def test_load_model_restores_the_latest_checkpoint(model_dir, config):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(path)
    assert loaded.config == config
    assert loaded.paths == [os.path.join(path, "ckpt-40")]
    assert_weights(loaded.model, weights[40])


def test_load_model_restores_an_explicit_checkpoint(model_dir):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(path, checkpoint=os.path.join(path, "ckpt-20"))
    assert loaded.paths == [os.path.join(path, "ckpt-20")]
    assert_weights(loaded.model, weights[20])


def test_load_model_reads_a_checkpoint_written_by_the_trainer(tiny_model_dir):
    """tiny_model_dir's ckpt-0 holds model and optimizer; only the model is read."""
    loaded = model_dir_lib.load_model(tiny_model_dir)
    assert loaded.paths == [os.path.join(tiny_model_dir, "ckpt-0")]
    reader = tf.train.load_checkpoint(loaded.paths[0])
    embedding = loaded.model.target_embedding.token_embedding.embeddings
    shapes = reader.get_variable_to_shape_map()
    stored = [k for k in shapes if shapes[k] == list(embedding.shape) and "OPTIMIZER" not in k]
    assert any(np.array_equal(reader.get_tensor(k), embedding.numpy()) for k in stored)
    assert np.abs(embedding.numpy()).max() > 0  # not left at zeros


def test_average_last_is_the_arithmetic_mean(model_dir):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(path, average_last=2)
    assert loaded.paths == [os.path.join(path, "ckpt-30"), os.path.join(path, "ckpt-40")]
    assert_weights(loaded.model, mean_weights(weights, (30, 40)))
    loaded = model_dir_lib.load_model(path, average_last=KEPT)
    assert_weights(loaded.model, mean_weights(weights, (20, 30, 40)))
    loaded = model_dir_lib.load_model(path, average_last=1)
    assert_weights(loaded.model, weights[40])


def test_average_last_refuses_a_checkpoint_and_too_few_checkpoints(model_dir):
    path, _ = model_dir
    with pytest.raises(ValueError, match="either a checkpoint or average_last"):
        model_dir_lib.load_model(path, checkpoint=os.path.join(path, "ckpt-20"), average_last=2)
    with pytest.raises(ValueError, match="fewer than 4 to average"):
        model_dir_lib.load_model(path, average_last=KEPT + 1)
    with pytest.raises(ValueError, match="no checkpoints to average"):
        model_dir_lib.average_into(build_model(Config.load(path).model), [])


def test_write_averaged_output_is_a_model_directory(model_dir, config, vocab_proto, tmp_path):
    path, weights = model_dir
    output = str(tmp_path / "averaged")
    written = model_dir_lib.write_averaged(path, 2, output, build_model)
    assert written == os.path.join(output, "averaged-40")  # named after the newest step
    assert Config.load(output) == config
    with open(os.path.join(output, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert f.read() == vocab_proto
    loaded = model_dir_lib.load_model(output)
    assert loaded.paths == [written]
    assert_weights(loaded.model, mean_weights(weights, (30, 40)))


def test_prepare_model_dir_writes_config_and_vocabulary(tmp_path, config, vocab_proto):
    path = str(tmp_path / "new")
    model_dir_lib.prepare_model_dir(path, config, vocab_proto)
    assert Config.load(path) == config
    with open(os.path.join(path, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert f.read() == vocab_proto
    assert sorted(os.listdir(path)) == ["config.json", model_dir_lib.VOCAB_FILE]
    # The same model again (resuming) is fine; other training settings are rewritten.
    resumed = config.replace(train=config.train.__class__(max_steps=7))
    model_dir_lib.prepare_model_dir(path, resumed, vocab_proto)
    assert Config.load(path).train.max_steps == 7


def test_prepare_model_dir_refuses_another_architecture(tmp_path, config, vocab_proto):
    path = str(tmp_path / "model")
    model_dir_lib.prepare_model_dir(path, config, vocab_proto)
    other = config.replace(model=config.model.__class__(
        **{**config.model.__dict__, "d_model": 64, "num_heads": 8}))
    with pytest.raises(ConfigError) as error:
        model_dir_lib.prepare_model_dir(path, other, vocab_proto)
    message = str(error.value)
    assert "different architecture" in message and "'d_model': (32, 64)" in message
    assert "'num_heads': (4, 8)" in message and "d_ff" not in message
    assert Config.load(path) == config  # left as it was


def test_prepare_model_dir_refuses_another_vocabulary(tmp_path, config, vocab_proto):
    path = str(tmp_path / "model")
    model_dir_lib.prepare_model_dir(path, config, vocab_proto)
    with pytest.raises(ConfigError, match="trained with another vocabulary"):
        model_dir_lib.prepare_model_dir(path, config, vocab_proto + b"x")
    with open(os.path.join(path, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert f.read() == vocab_proto


def separate(config, source_vocab_size=400):
    return config.replace(model=config.model.__class__(**{
        **config.model.__dict__, "share_embeddings": False,
        "source_vocab_size": source_vocab_size}))


def test_separate_vocabularies_are_two_files(tmp_path, config, vocab_proto):
    """source_vocab.model and target_vocab.model instead of vocab.model; vocab_paths names
    them in that order (vocab.model twice when shared), and averaging copies both."""
    path = str(tmp_path / "pair")
    source_proto = vocab_proto + b"source"  # prepare_model_dir copies bytes, never parses them
    model_dir_lib.prepare_model_dir(path, separate(config), source_proto, vocab_proto)
    assert sorted(os.listdir(path)) == ["config.json", model_dir_lib.SOURCE_VOCAB_FILE,
                                        model_dir_lib.TARGET_VOCAB_FILE]
    source, target = model_dir_lib.vocab_paths(path)
    assert (os.path.basename(source), os.path.basename(target)) == (
        model_dir_lib.SOURCE_VOCAB_FILE, model_dir_lib.TARGET_VOCAB_FILE)
    assert model_dir_lib.read_vocabularies(path) == (source_proto, vocab_proto)
    model_dir_lib.prepare_model_dir(path, separate(config), source_proto, vocab_proto)  # resume
    with pytest.raises(ConfigError, match="another vocabulary"):
        model_dir_lib.prepare_model_dir(path, separate(config), vocab_proto, vocab_proto)
    with pytest.raises(ConfigError, match="holds source_vocab.model"):  # the shared kind
        model_dir_lib.prepare_model_dir(path, config, vocab_proto)
    with pytest.raises(ConfigError, match="share_embeddings=False"):
        model_dir_lib.prepare_model_dir(str(tmp_path / "shared_embeddings"), config,
                                        source_proto, vocab_proto)

    shared = str(tmp_path / "shared")
    model_dir_lib.prepare_model_dir(shared, config, vocab_proto)
    assert model_dir_lib.vocab_paths(shared) == (os.path.join(shared, "vocab.model"),) * 2
    assert model_dir_lib.read_vocabularies(shared) == (vocab_proto, None)
    with pytest.raises(ConfigError, match="holds vocab.model"):
        model_dir_lib.prepare_model_dir(shared, separate(config), source_proto, vocab_proto)
    with pytest.raises(FileNotFoundError, match="neither vocab.model"):
        model_dir_lib.vocab_paths(str(tmp_path))


def test_write_averaged_copies_both_vocabularies(tmp_path, config, vocab_proto):
    path, output = str(tmp_path / "pair"), str(tmp_path / "averaged")
    model_dir_lib.prepare_model_dir(path, separate(config), vocab_proto + b"source", vocab_proto)
    model = build_model(separate(config).model)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), path, max_to_keep=2)
    manager.save(checkpoint_number=1)
    manager.save(checkpoint_number=2)
    model_dir_lib.write_averaged(path, 2, output, build_model)
    assert model_dir_lib.read_vocabularies(output) == (vocab_proto + b"source", vocab_proto)
    assert Config.load(output).model.source_vocab_size == 400
