"""config.py on its own: each dataclass refuses what cannot describe a run, and
a Config survives the JSON round trip through a model directory."""

import dataclasses
import json

import pytest

from tf_transformer import presets
from tf_transformer.config import (
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
)
from tf_transformer.model_dir import CONFIG_FILE, ModelDir


@pytest.mark.parametrize("cls, fields, message", [
    (ModelConfig, {"vocab_size": 0}, "vocab_size must be positive, got 0"),
    (ModelConfig, {"num_layers": -1}, "num_layers must be positive, got -1"),
    (ModelConfig, {"d_model": 0}, "d_model must be positive"),
    (ModelConfig, {"d_ff": 0}, "d_ff must be positive"),
    (ModelConfig, {"num_heads": 0}, "num_heads must be positive"),
    (ModelConfig, {"max_positions": 0}, "max_positions must be positive"),
    (ModelConfig, {"d_k": -8}, "d_k and d_v must be positive"),
    (ModelConfig, {"d_v": -8}, "d_k and d_v must be positive"),
    (ModelConfig, {"d_model": 510, "num_heads": 8},
     "d_model=510 is not divisible by num_heads=8"),
    (ModelConfig, {"positions": "rotary"}, "positions must be one of"),
    (ModelConfig, {"d_model": 9, "num_heads": 3}, "sinusoidal positions need an even d_model"),
    (ModelConfig, {"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
    (ModelConfig, {"attention_dropout": -0.1}, "attention_dropout must be in [0, 1)"),
    (ModelConfig, {"source_vocab_size": 100}, "source_vocab_size differs from vocab_size"),
    (ModelConfig, {"vocab_size": 3}, "vocab_size must exceed the reserved ids"),
    (DataConfig, {"max_length": 1}, "max_length must leave room for BOS/EOS"),
    (DataConfig, {"max_length": 300, "tokens_per_batch": 299},
     "tokens_per_batch=299 is smaller than max_length=300"),
    (DataConfig, {"bucket_step": 1.0}, "bucket_step must be > 1"),
    (DataConfig, {"bucket_multiple": 0}, "bucket_multiple and min_bucket must be positive"),
    (DataConfig, {"min_bucket": 0}, "bucket_multiple and min_bucket must be positive"),
    (TrainConfig, {"label_smoothing": 1.0}, "label_smoothing must be in [0, 1)"),
    (TrainConfig, {"warmup_steps": 0}, "warmup_steps must be positive"),
    (TrainConfig, {"accum_steps": 0}, "accum_steps must be >= 1"),
    (TrainConfig, {"dtype": "float16"}, "unknown dtype 'float16'"),
    (DecodeConfig, {"beam_size": 0}, "beam_size must be >= 1"),
    (DecodeConfig, {"nbest": 5}, "nbest must be in [1, beam_size=4]"),
    (DecodeConfig, {"nbest": 0}, "nbest must be in [1, beam_size=4]"),
    (DecodeConfig, {"extra_length": 0}, "extra_length must be >= 1"),
])
def test_each_bad_field_is_refused_with_its_name(cls, fields, message):
    with pytest.raises(ConfigError) as error:
        cls(**fields)
    assert message in str(error.value)
    assert isinstance(error.value, ValueError)  # callers may catch either


@pytest.mark.parametrize("cls, fields", [
    (ModelConfig, {"d_model": 510, "num_heads": 8, "d_k": 64, "d_v": 64}),  # row A style
    (ModelConfig, {"positions": "learned", "d_model": 9, "num_heads": 3}),  # odd d_model ok
    (ModelConfig, {"share_embeddings": False, "source_vocab_size": 100}),
    (ModelConfig, {"vocab_size": 4, "dropout": 0.0}),
    (DataConfig, {"max_length": 2, "tokens_per_batch": 2}),
    (DecodeConfig, {"beam_size": 1, "nbest": 1}),
])
def test_boundary_values_are_accepted(cls, fields):
    config = cls(**fields)
    assert all(getattr(config, k) == v for k, v in fields.items())


def test_key_and_value_dims():
    base = ModelConfig()
    assert (base.key_dim, base.value_dim) == (64, 64)  # d_model / h
    assert (ModelConfig(d_k=16).key_dim, ModelConfig(d_k=16).value_dim) == (16, 64)
    assert (ModelConfig(d_v=32).key_dim, ModelConfig(d_v=32).value_dim) == (64, 32)
    assert ModelConfig(num_heads=1, d_k=512, d_v=512).key_dim == 512
    assert ModelConfig(vocab_size=100).input_vocab_size == 100
    assert ModelConfig(vocab_size=100, share_embeddings=False,
                       source_vocab_size=50).input_vocab_size == 50


def test_configs_are_frozen():
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.d_model = 256  # type: ignore[misc]


def _custom() -> Config:
    return Config(
        model=ModelConfig(vocab_size=500, num_layers=2, d_model=32, d_ff=64, num_heads=4, d_k=16,
                          positions="learned", share_embeddings=False, source_vocab_size=400,
                          pre_norm=True, dropout=0.2),
        data=DataConfig(max_length=64, tokens_per_batch=1024, bucket_step=1.2, deterministic=True),
        train=TrainConfig(label_smoothing=0.2, dtype="mixed_bfloat16", accum_steps=3,
                          checkpoint_minutes=2.5),
        decode=DecodeConfig(beam_size=6, nbest=3, alpha=1.0, jit_compile=True))


def test_json_round_trip_keeps_every_field():
    config = _custom()
    assert Config.from_json(config.to_json()) == config
    raw = json.loads(config.to_json())
    assert raw["model"]["d_k"] == 16 and raw["train"]["dtype"] == "mixed_bfloat16"
    assert set(raw) == {"model", "data", "train", "decode"}


def test_missing_parts_and_keys_take_the_defaults():
    config = Config.from_json(json.dumps({"model": {"vocab_size": 500}}))
    assert config == Config(model=ModelConfig(vocab_size=500))


def test_unknown_keys_are_refused_by_name():
    raw = json.loads(Config().to_json())
    raw["train"]["learning_rate"] = 0.1
    with pytest.raises(ConfigError, match=r"unknown train config keys: \['learning_rate'\]"):
        Config.from_json(json.dumps(raw))


def test_invalid_values_in_json_are_refused():
    raw = json.loads(Config().to_json())
    raw["decode"]["nbest"] = 9
    with pytest.raises(ConfigError, match="nbest"):
        Config.from_json(json.dumps(raw))


def test_save_and_load_through_a_model_directory(tmp_path):
    config, model_dir = _custom(), ModelDir(str(tmp_path / "model"))
    path = model_dir.write_config(config)
    assert path == str(tmp_path / "model" / CONFIG_FILE)
    assert not (tmp_path / "model" / (CONFIG_FILE + ".tmp")).exists()
    assert model_dir.read_config() == config
    model_dir.write_config(config.replace(decode=DecodeConfig(beam_size=2, nbest=1)))
    assert model_dir.read_config().decode.beam_size == 2  # replaced in place


def test_loading_a_directory_without_config_says_so(tmp_path):
    with pytest.raises(ConfigError, match="config.json not found: is .* a model directory"):
        ModelDir(str(tmp_path)).read_config()


def test_decode_overrides_nbest_follows_the_beam_down():
    decode = DecodeConfig(beam_size=8, nbest=4, alpha=0.6)
    assert decode.with_overrides({}) == decode
    assert decode.with_overrides({"alpha": 1.0}) == dataclasses.replace(decode, alpha=1.0)
    assert decode.with_overrides({"beam_size": 2}).nbest == 2  # 4 would exceed the beam
    assert decode.with_overrides({"beam_size": 12}).nbest == 4  # kept when it fits
    assert decode.with_overrides({"beam_size": 2, "nbest": 1}).nbest == 1  # the user's own
    with pytest.raises(ConfigError, match="nbest"):
        decode.with_overrides({"beam_size": 2, "nbest": 3})  # the user's, too large
    assert decode.with_overrides({"beam_size": 3, "nbest": 3}).beam_size == 3
    assert decode == DecodeConfig(beam_size=8, nbest=4, alpha=0.6)  # not modified


def test_decode_overrides_all_beams_returns_every_hypothesis():
    decode = DecodeConfig(beam_size=4, nbest=1)
    assert decode.with_overrides({}, all_beams=True).nbest == 4
    assert decode.with_overrides({"beam_size": 6}, all_beams=True).nbest == 6
    assert decode.with_overrides({"beam_size": 6, "nbest": 2}, all_beams=True).nbest == 2
    with pytest.raises(TypeError):
        decode.with_overrides({"beams": 6})  # not a DecodeConfig field


@pytest.mark.parametrize("name", presets.preset_names())
def test_every_preset_is_valid_and_round_trips(name, tmp_path):
    config = presets.get_preset(name, vocab_size=1000)
    assert config.model.vocab_size == 1000
    assert Config.from_json(config.to_json()) == config
    ModelDir(str(tmp_path)).write_config(config)
    assert ModelDir(str(tmp_path)).read_config() == config


def test_unknown_preset_is_refused():
    with pytest.raises(ConfigError, match="unknown preset 'no_such_preset'; known: base"):
        presets.get_preset("no_such_preset")


def test_model_overrides_reset_a_presets_head_sizes():
    row_a = presets.get_preset("a_h4", vocab_size=1000).model  # h=4, d_k=d_v=128
    assert (row_a.key_dim, row_a.value_dim) == (128, 128)
    smaller = row_a.with_overrides({"d_model": 256})
    assert (smaller.d_k, smaller.d_v, smaller.key_dim) == (0, 0, 64)  # d_model / h again
    assert row_a.with_overrides({"num_heads": 8}).key_dim == 64
    assert row_a.with_overrides({"d_model": 256, "d_k": 32}).key_dim == 32  # the user's own
    assert row_a.with_overrides({"d_ff": 1024}).key_dim == 128  # head sizes untouched
    assert row_a.with_overrides({}) == row_a


def test_with_vocab_size_sets_one_shared_vocabulary_or_two_separate_ones():
    config = Config()
    shared = config.with_vocab_size(8000)
    assert (shared.model.vocab_size, shared.model.share_embeddings) == (8000, True)
    separate = config.with_vocab_size(8000, 6000)
    assert (separate.model.vocab_size, separate.model.source_vocab_size) == (8000, 6000)
    assert not separate.model.share_embeddings
    assert separate.train == config.train and config.model.vocab_size == 37000
