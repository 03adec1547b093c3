"""model_dir/ on its own: the model-directory contract, averaging, and the rule that
no other module joins a path onto a model directory (read from the source's AST).

The fixture writes four checkpoints of a tiny model whose weights are set to
known random values before each save (the manager keeps the last three), so
every loaded or averaged weight can be compared with numpy.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from model_dir_fixtures import assert_weights, mean_weights, path_joins_onto_model_dirs
from model_fixtures import REPO_ROOT, tiny_config

from tf_transformer.config import ConfigError
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir

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
    ModelDir(path).prepare(config, vocab_proto)
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
    assert ModelDir(path).resolve() == os.path.join(path, "ckpt-40")
    explicit = os.path.join(path, "ckpt-20")
    assert ModelDir(path).resolve(explicit) == explicit
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        ModelDir(str(tmp_path)).resolve()
    assert ModelDir(str(tmp_path)).checkpoint_paths() == []


def test_checkpoint_paths_and_last_checkpoints_are_oldest_first(model_dir):
    path, _ = model_dir
    kept = [os.path.join(path, f"ckpt-{s}") for s in STEPS[-KEPT:]]
    assert ModelDir(path).checkpoint_paths() == kept
    assert ModelDir(path).last_checkpoints(2) == kept[-2:]
    assert ModelDir(path).last_checkpoints(KEPT) == kept
    with pytest.raises(ValueError, match=f"keeps {KEPT} checkpoints, fewer than {KEPT + 1}"):
        ModelDir(path).last_checkpoints(KEPT + 1)


def test_load_model_restores_the_latest_checkpoint(model_dir, config):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(ModelDir(path))
    assert loaded.config == config
    assert loaded.paths == [os.path.join(path, "ckpt-40")]
    assert_weights(loaded.model, weights[40])


def test_load_model_restores_an_explicit_checkpoint(model_dir):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(ModelDir(path), checkpoint=os.path.join(path, "ckpt-20"))
    assert loaded.paths == [os.path.join(path, "ckpt-20")]
    assert_weights(loaded.model, weights[20])


def test_load_model_reads_a_checkpoint_written_by_the_trainer(tiny_model_dir):
    """tiny_model_dir's ckpt-0 holds model and optimizer; only the model is read."""
    loaded = model_dir_lib.load_model(ModelDir(tiny_model_dir))
    assert loaded.paths == [os.path.join(tiny_model_dir, "ckpt-0")]
    reader = tf.train.load_checkpoint(loaded.paths[0])
    embedding = loaded.model.target_embedding.token_embedding.embeddings
    shapes = reader.get_variable_to_shape_map()
    stored = [k for k in shapes if shapes[k] == list(embedding.shape) and "OPTIMIZER" not in k]
    assert any(np.array_equal(reader.get_tensor(k), embedding.numpy()) for k in stored)
    assert np.abs(embedding.numpy()).max() > 0  # not left at zeros


def test_average_last_is_the_arithmetic_mean(model_dir):
    path, weights = model_dir
    loaded = model_dir_lib.load_model(ModelDir(path), average_last=2)
    assert loaded.paths == [os.path.join(path, "ckpt-30"), os.path.join(path, "ckpt-40")]
    assert_weights(loaded.model, mean_weights(weights, (30, 40)))
    loaded = model_dir_lib.load_model(ModelDir(path), average_last=KEPT)
    assert_weights(loaded.model, mean_weights(weights, (20, 30, 40)))
    loaded = model_dir_lib.load_model(ModelDir(path), average_last=1)
    assert_weights(loaded.model, weights[40])


def test_average_last_refuses_a_checkpoint_and_too_few_checkpoints(model_dir):
    path, _ = model_dir
    with pytest.raises(ValueError, match="either a checkpoint or average_last"):
        model_dir_lib.load_model(ModelDir(path), checkpoint=os.path.join(path, "ckpt-20"),
                                 average_last=2)
    with pytest.raises(ValueError, match="fewer than 4 to average"):
        model_dir_lib.load_model(ModelDir(path), average_last=KEPT + 1)
    with pytest.raises(ValueError, match="no checkpoints to average"):
        model_dir_lib.average_into(build_model(ModelDir(path).read_config().model), [])


def test_write_averaged_output_is_a_model_directory(model_dir, config, vocab_proto, tmp_path):
    path, weights = model_dir
    output = str(tmp_path / "averaged")
    written = model_dir_lib.write_averaged(ModelDir(path), 2, ModelDir(output), build_model)
    assert written == os.path.join(output, "averaged-40")  # named after the newest step
    assert ModelDir(output).read_config() == config
    with open(os.path.join(output, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert f.read() == vocab_proto
    loaded = model_dir_lib.load_model(ModelDir(output))
    assert loaded.paths == [written]
    assert_weights(loaded.model, mean_weights(weights, (30, 40)))


def test_prepare_model_dir_writes_config_and_vocabulary(tmp_path, config, vocab_proto):
    path = str(tmp_path / "new")
    ModelDir(path).prepare(config, vocab_proto)
    assert ModelDir(path).read_config() == config
    with open(os.path.join(path, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert f.read() == vocab_proto
    assert sorted(os.listdir(path)) == ["config.json", model_dir_lib.VOCAB_FILE]
    # The same model again (resuming) is fine; other training settings are rewritten.
    resumed = config.replace(train=config.train.__class__(max_steps=7))
    ModelDir(path).prepare(resumed, vocab_proto)
    assert ModelDir(path).read_config().train.max_steps == 7


def test_prepare_model_dir_refuses_another_architecture(tmp_path, config, vocab_proto):
    path = str(tmp_path / "model")
    ModelDir(path).prepare(config, vocab_proto)
    other = config.replace(model=config.model.__class__(
        **{**config.model.__dict__, "d_model": 64, "num_heads": 8}))
    with pytest.raises(ConfigError) as error:
        ModelDir(path).prepare(other, vocab_proto)
    message = str(error.value)
    assert "different architecture" in message and "'d_model': (32, 64)" in message
    assert "'num_heads': (4, 8)" in message and "d_ff" not in message
    assert ModelDir(path).read_config() == config  # left as it was


def test_prepare_model_dir_refuses_another_vocabulary(tmp_path, config, vocab_proto):
    path = str(tmp_path / "model")
    ModelDir(path).prepare(config, vocab_proto)
    with pytest.raises(ConfigError, match="trained with another vocabulary"):
        ModelDir(path).prepare(config, vocab_proto + b"x")
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
    ModelDir(path).prepare(separate(config), source_proto, vocab_proto)
    assert sorted(os.listdir(path)) == ["config.json", model_dir_lib.SOURCE_VOCAB_FILE,
                                        model_dir_lib.TARGET_VOCAB_FILE]
    source, target = ModelDir(path).vocab_paths()
    assert (os.path.basename(source), os.path.basename(target)) == (
        model_dir_lib.SOURCE_VOCAB_FILE, model_dir_lib.TARGET_VOCAB_FILE)
    assert ModelDir(path).read_vocabularies() == (source_proto, vocab_proto)
    ModelDir(path).prepare(separate(config), source_proto, vocab_proto)  # resume
    with pytest.raises(ConfigError, match="another vocabulary"):
        ModelDir(path).prepare(separate(config), vocab_proto, vocab_proto)
    with pytest.raises(ConfigError, match="holds source_vocab.model"):  # the shared kind
        ModelDir(path).prepare(config, vocab_proto)
    with pytest.raises(ConfigError, match="share_embeddings=False"):
        ModelDir(str(tmp_path / "shared_embeddings")).prepare(config, source_proto,
                                                              vocab_proto)

    shared = str(tmp_path / "shared")
    ModelDir(shared).prepare(config, vocab_proto)
    assert ModelDir(shared).vocab_paths() == (os.path.join(shared, "vocab.model"),) * 2
    assert ModelDir(shared).read_vocabularies() == (vocab_proto, None)
    with pytest.raises(ConfigError, match="holds vocab.model"):
        ModelDir(shared).prepare(separate(config), source_proto, vocab_proto)
    with pytest.raises(FileNotFoundError, match="neither vocab.model"):
        ModelDir(str(tmp_path)).vocab_paths()


def test_write_averaged_copies_both_vocabularies(tmp_path, config, vocab_proto):
    path, output = str(tmp_path / "pair"), str(tmp_path / "averaged")
    ModelDir(path).prepare(separate(config), vocab_proto + b"source", vocab_proto)
    model = build_model(separate(config).model)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), path, max_to_keep=2)
    manager.save(checkpoint_number=1)
    manager.save(checkpoint_number=2)
    model_dir_lib.write_averaged(ModelDir(path), 2, ModelDir(output), build_model)
    assert ModelDir(output).read_vocabularies() == (vocab_proto + b"source", vocab_proto)
    assert ModelDir(output).read_config().model.source_vocab_size == 400


def test_the_model_dir_names_every_path_of_the_contract(tmp_path):
    """Where training writes: the chief's checkpoints in the directory, other workers'
    in a scratch directory; each worker's input state; summaries; best/."""
    path = str(tmp_path)
    model_dir = ModelDir(path)
    assert model_dir.checkpoint_dir(0, chief=True) == path
    assert model_dir.checkpoint_dir(2, chief=False) == os.path.join(path, ".worker_2_scratch")
    assert model_dir.input_state_dir(1) == os.path.join(path, "input", "worker_1")
    assert model_dir.summaries_dir("train") == os.path.join(path, "train")
    with pytest.raises(ValueError, match="summaries go to one of"):
        model_dir.summaries_dir("eval")
    assert model_dir.best_dir == os.path.join(path, "best")
    assert model_dir.config_path == os.path.join(path, "config.json")
    assert model_dir.named_checkpoint("ckpt-3") == os.path.join(path, "ckpt-3")
    assert not model_dir.is_model_dir() and model_dir.latest_checkpoint() is None
    assert model_dir.read_init_from() is None
    model_dir.write_init_from({"step": 3})
    assert model_dir.read_init_from() == {"step": 3}
    assert sorted(os.listdir(path)) == ["init_from.json"]  # its temporary file renamed
    assert ModelDir.of(path) == model_dir and ModelDir.of(model_dir) is model_dir


def _joins_by_module() -> dict[str, list[str]]:
    """Module path (from the repository root) -> its joins onto a model directory, for
    every module of tf_transformer/ and export/ outside tf_transformer/model_dir/."""
    found = {}
    for package in ("tf_transformer", "export"):
        for directory, _, files in os.walk(os.path.join(REPO_ROOT, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, REPO_ROOT).replace(os.sep, "/")
                if module.startswith("tf_transformer/model_dir/"):
                    continue
                with open(path, encoding="utf-8") as f:
                    joins = path_joins_onto_model_dirs(f.read())
                if joins:
                    found[module] = joins
    return found


def test_only_the_model_dir_package_joins_paths_onto_a_model_directory():
    assert _joins_by_module() == {}


def test_the_join_finder_sees_each_kind_of_join():
    offenders = path_joins_onto_model_dirs(
        "import os\n"
        "a = os.path.join(self.model_dir, 'train')\n"
        "b = os.path.join(FLAGS.model_dir, f'.worker_{i}_scratch')\n"
        "c = os.path.join(source_dir, model_dir_lib.VOCAB_FILE)\n"
        "d = os.path.join(path, CONFIG_FILE)\n"
        "e = model_dir + '/config.json'\n"
        "f = f'{model_dir}/vocab.model'\n"
        "g = pathlib.Path(model_dir) / 'best'\n")
    assert len(offenders) == 8  # g counts twice: Path(model_dir) and its "/"
    fine = path_joins_onto_model_dirs(
        "import os\n"
        "a = ModelDir(FLAGS.model_dir).summaries_dir('train')\n"
        "b = os.path.abspath(FLAGS.model_dir)\n"
        "c = f'no checkpoint in {model_dir}: is it a model directory?'\n"
        "d = os.path.join(export_dir, str(version))\n")
    assert fine == []


def test_a_model_load_reads_config_json_once(tiny_model_dir, monkeypatch):
    """Translator.from_model_dir reads config.json once (it was read twice), and not at all
    when the caller hands it the Config it read (translator_from_flags)."""
    from tf_transformer.decoding.translator import Translator

    reads, read_config = [], ModelDir.read_config

    def counted(self):
        reads.append(self)
        return read_config(self)

    monkeypatch.setattr(ModelDir, "read_config", counted)
    model_dir = ModelDir(tiny_model_dir)
    translator = Translator.from_model_dir(model_dir)
    assert reads == [model_dir] and translator.config == read_config(model_dir)
    Translator.from_model_dir(model_dir, config=translator.config)
    assert reads == [model_dir]
