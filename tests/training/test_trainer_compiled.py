"""The compiled step (TrainConfig.compile_step): same numbers as the graph step, one XLA
compilation per batch shape, and PAD rows that change nothing."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import (
    BOS_ID,
    EOS_ID,
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    TrainConfig,
)
from tf_transformer.inputs import corpus, pipeline
from tf_transformer.training.trainer import Trainer

MODEL = ModelConfig(vocab_size=30, num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0)
# The shared trainers' batches: ROWS x LENGTH, and with PAD_ROWS rows of PAD the longer shape
# of the static run's batches (one XLA compilation serves both tests).
ROWS, LENGTH, PAD_ROWS = 12, 16, 4


def _config(data=DataConfig(), **train):
    return Config(model=MODEL, data=data, train=TrainConfig(
        **{"warmup_steps": 10, "log_every": 1, "checkpoint_minutes": 1e9, **train}))


def _batch(seed, batch, length, pad_rows=0):
    """Random pairs of lengths 2..length (row 0 full), then `pad_rows` rows of PAD."""
    rng = np.random.default_rng(seed)
    out = {k: np.zeros((batch + pad_rows, length), np.int32)
           for k in ("source", "target_in", "target_out")}
    for i, n in enumerate([length] + list(rng.integers(2, length + 1, size=batch - 1))):
        out["source"][i, :n] = rng.integers(4, 30, size=n)
        words = rng.integers(4, 30, size=n - 1)
        out["target_in"][i, :n] = [BOS_ID, *words]
        out["target_out"][i, :n] = [*words, EOS_ID]
    return out


def _trainer(tmp_path, name, vocab_size=MODEL.vocab_size, **train):
    config = _config(**train).replace(model=dataclasses.replace(MODEL, vocab_size=vocab_size))
    return Trainer(config, str(tmp_path / name), tf.distribute.OneDeviceStrategy("/cpu:0"))


def _steps(trainer, batches):
    """Runs one optimizer step per batch (all of one shape); returns the outputs as floats."""
    iterator = iter(tf.data.Dataset.from_tensor_slices(
        {k: np.stack([b[k] for b in batches]) for k in batches[0]}))
    step = trainer.step_fn()
    return [{k: float(v) for k, v in step(iterator).items() if k != "flags"} for _ in batches]


def _key_bias_free(variable):
    """A weight without the key biases of attention: softmax is invariant to them, so their
    true gradient is 0 and Adam turns rounding noise into updates (as in test_trainer.py)."""
    value, hk = variable.numpy(), MODEL.num_heads * MODEL.key_dim
    if variable.path.endswith("self_attention/qkv_bias"):
        value = np.concatenate([value[:hk], value[2 * hk:]])
    if variable.path.endswith("cross_attention/key_value_bias"):
        value = value[hk:]
    return value


def _assert_same_weights(a, b, atol):
    for x, y in zip(a.model.weights, b.model.weights):
        np.testing.assert_allclose(_key_bias_free(x), _key_bias_free(y), atol=atol,
                                   err_msg=x.path)


class Trainers:
    """A graph-step and a compiled-step trainer from the same initial weights, shared by the
    tests below: each trace costs seconds, each XLA compilation (one per batch shape and
    trainer) more. `reset` puts back both trainers' initial weights and optimizer state;
    `steps` runs `_steps` and records the batch shapes the compiled trainer has seen."""

    def __init__(self, directory, vocab_size):
        self.graph = _trainer(directory, "graph", vocab_size)
        self.compiled = _trainer(directory, "xla", vocab_size, compile_step=True)
        self.compiled_shapes = set()
        self._initial = {name: trainer.checkpoint.write(str(directory / f"{name}_initial"))
                         for name, trainer in self._named()}

    def steps(self, trainer, batches):
        if trainer is self.compiled:
            self.compiled_shapes.update(b["source"].shape for b in batches)
        return _steps(trainer, batches)

    def _named(self):
        return (("graph", self.graph), ("compiled", self.compiled))

    def reset(self):
        for name, trainer in self._named():
            trainer.checkpoint.read(self._initial[name]).assert_consumed()
            assert trainer.step == 0


@pytest.fixture(scope="module")
def trainers(tmp_path_factory, small_tokenizer):
    """On the vocabulary of `small_tokenizer` (the static run's batches; the random batches
    use ids below 30)."""
    return Trainers(tmp_path_factory.mktemp("trainers"), small_tokenizer.vocab_size)


def test_compiled_step_equals_the_graph_step(trainers):
    """Loss, gradients and the weights after two Adam steps, to float32 tolerance."""
    trainers.reset()
    graph, compiled = trainers.graph, trainers.compiled
    batches = [_batch(1, ROWS, LENGTH), _batch(2, ROWS, LENGTH)]
    # The gradients of the compiled program's first half (every position, pads weighted 0)
    # against the graph step's (the output layer on non-pad positions only).
    batch = {k: tf.constant(v) for k, v in batches[0].items()}
    want = graph.train_step.grads(batch)
    got = tf.function(compiled.train_step.grads, autograph=False, jit_compile=True)(batch)
    np.testing.assert_allclose(float(got[1]), float(want[1]), rtol=1e-6)
    assert float(got[2]) == float(want[2]) < ROWS * LENGTH
    for g, w in zip(got[0], want[0]):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6)
    out_graph, out_compiled = trainers.steps(graph, batches), trainers.steps(compiled, batches)
    for g, c in zip(out_graph, out_compiled):
        assert g.keys() == c.keys() and g["target_tokens"] == c["target_tokens"]
        for key in ("loss", "grad_norm", "flops"):
            np.testing.assert_allclose(c[key], g[key], rtol=1e-5)
    assert compiled.step == graph.step == 2
    _assert_same_weights(graph, compiled, atol=2e-5)


@pytest.mark.parametrize("compile_step", [False, True])
def test_pad_rows_change_neither_the_loss_nor_the_update(trainers, compile_step):
    """One step on a batch, then from the same initial state on it with 4 PAD rows added
    (the batch has the shape of the batches above: the compiled step is not compiled again
    for it, only for the padded one, which is a shape of the static run below)."""
    trainer = trainers.compiled if compile_step else trainers.graph
    trainers.reset()
    out_plain = trainers.steps(trainer, [_batch(3, ROWS, LENGTH)])
    plain = [_key_bias_free(v) for v in trainer.model.weights]
    assert trainer.step == 1
    trainers.reset()
    out_padded = trainers.steps(trainer, [_batch(3, ROWS, LENGTH, pad_rows=PAD_ROWS)])
    assert trainer.step == 1
    for key in ("loss", "grad_norm", "target_tokens", "source_tokens"):
        np.testing.assert_allclose(out_padded[0][key], out_plain[0][key], rtol=1e-6)
    for x, y in zip(plain, trainer.model.weights):
        np.testing.assert_allclose(_key_bias_free(y), x, atol=1e-6, err_msg=y.path)


def test_static_run_compiles_once_per_batch_shape(trainers, embedded_corpus, small_tokenizer):
    """A training run on static batches: one XLA compilation per shape not compiled before,
    however many steps (the shared compiled trainer: its shapes so far are the tests' above;
    the padded batch's is the longer static shape, the shorter one is always new)."""
    data = DataConfig(max_length=16, tokens_per_batch=256, static_batch=True,
                      static_boundaries=(8,), deterministic=True, shuffle_buffer=200)
    pairs = corpus.Corpus(embedded_corpus.sources[:400], embedded_corpus.targets[:400])
    batches = list(pipeline.make_dataset(pairs, small_tokenizer, data, training=True)
                   .take(14).as_numpy_iterator())
    shapes = {b["source"].shape for b in batches}
    assert shapes == {(32, 8), (16, 16)}  # two shapes (each compiles in seconds), many steps
    assert (ROWS + PAD_ROWS, LENGTH) in shapes and (ROWS, LENGTH) not in shapes
    new_shapes = shapes - trainers.compiled_shapes
    assert (32, 8) in new_shapes
    trainers.reset()
    trainer = trainers.compiled
    compiles, seconds = trainer.step_fn().compiles, trainer.step_fn().compile_seconds

    def dataset_fn(start_step):
        return lambda ctx: tf.data.Dataset.from_generator(
            lambda: iter(batches), output_signature={
                k: tf.TensorSpec([None, None], tf.int32) for k in batches[0]})

    result = trainer.train(dataset_fn, max_steps=len(batches), log_fn=lambda line: None)
    trainers.compiled_shapes |= shapes
    assert result.step == len(batches)
    assert trainer.step_fn().compiles == compiles + len(new_shapes)
    assert trainer.step_fn().compile_seconds > seconds


def test_mixed_float16_compiled_step_scales_the_loss(tmp_path):
    trainer = _trainer(tmp_path, "fp16", compile_step=True, dtype="mixed_float16")
    graph = _trainer(tmp_path, "fp16_graph", dtype="mixed_float16")
    batches = [_batch(4, 4, 9)] * 3
    out, want = _steps(trainer, batches), _steps(graph, batches)
    # Overflowing steps are skipped and the scale lowered the same way inside XLA.
    assert trainer.step == graph.step and trainer.loss_scale == graph.loss_scale
    np.testing.assert_allclose(out[-1]["grad_norm"], want[-1]["grad_norm"], rtol=1e-3)
    np.testing.assert_allclose([o["loss"] for o in out], [w["loss"] for w in want], rtol=1e-2)


def test_compile_step_refuses_two_replicas(tmp_path):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    trainer = Trainer(_config(compile_step=True), str(tmp_path), mirrored)
    with pytest.raises(ConfigError, match="one replica"):
        trainer.step_fn()


