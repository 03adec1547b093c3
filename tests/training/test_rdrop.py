"""R-Drop (--rdrop_alpha, training/step.py: TrainStep.rdrop_sums; the divergence:
training/losses.py: compiled_symmetric_kl): the divergence against numpy, alpha 0 the
step of before bit for bit, dropout 0 adding nothing, independent masks in the two
halves, the gathered rows, accumulation on two replicas, --jit_compile and bfloat16."""

import collections
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from model_fixtures import REPO_ROOT
from trainer_fixtures import MODEL, STEPS, dataset_of, pad_batch, random_batch

from tf_transformer.config import PAD_ID, Config, ConfigError, TrainConfig
from tf_transformer.training import losses
from tf_transformer.training import step as step_lib
from tf_transformer.training.trainer import StepPolicy, Trainer

DROPOUT = dataclasses.replace(MODEL, dropout=0.3, attention_dropout=0.1)
KEY = tf.constant(11, tf.int64)


def _trainer(tmp_path, name, model=DROPOUT, strategy=None, gather=None, **train):
    config = Config(model=model, train=TrainConfig(warmup_steps=10, log_every=1,
                                                   checkpoint_minutes=1e9, **train))
    policy = None if gather is None else StepPolicy(gather_targets=gather)
    return Trainer(config, str(tmp_path / name), strategy or tf.distribute.get_strategy(),
                   step_policy=policy)


@pytest.fixture(scope="module")
def rdrop_trainer(tmp_path_factory):
    """R-Drop (alpha 5) with dropout, CPU's gathered rows: read by the tests below, never
    trained (a trainer's model and optimizer take a second to build)."""
    return _trainer(tmp_path_factory.mktemp("rdrop"), "run", rdrop_alpha=5.0)


@pytest.fixture(scope="module")
def jit_rdrop_trainer(tmp_path_factory):
    """The same under --jit_compile: its compiled forward and backward pass is traced once
    for the two tests that use it (seconds each); only one of them trains it."""
    return _trainer(tmp_path_factory.mktemp("jit_rdrop"), "run", rdrop_alpha=5.0,
                    jit_compile=True)


def _batch(seed=3):
    return {k: tf.constant(v) for k, v in pad_batch(random_batch(seed, 4, 6), 9).items()}


def _numpy_symmetric_kl(first, second, labels):
    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    log_p, log_q = log_softmax(first.astype(np.float64)), log_softmax(second.astype(np.float64))
    p, q = np.exp(log_p), np.exp(log_q)
    kl = (p * (log_p - log_q)).sum(-1) + (q * (log_q - log_p)).sum(-1)
    return kl * (labels != PAD_ID)


def test_symmetric_kl_equals_numpy_and_its_gradient_autodiff():
    rng = np.random.default_rng(0)
    first = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    second = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    labels = rng.integers(1, 11, size=(3, 5)).astype(np.int32)
    labels[0, 3:] = PAD_ID
    labels[2, 1:] = PAD_ID
    a, b = tf.constant(first), tf.constant(second)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        divergence, weights = losses.compiled_symmetric_kl(a, b, tf.constant(labels))
        log_p, log_q = tf.nn.log_softmax(a), tf.nn.log_softmax(b)
        reference = tf.reduce_sum((tf.exp(log_p) - tf.exp(log_q)) * (log_p - log_q), -1)
        upstream = tf.constant(rng.normal(size=(3, 5)).astype(np.float32))
        objective = tf.reduce_sum(divergence * upstream)
        wanted = tf.reduce_sum(reference * weights * upstream)
    assert divergence.dtype == tf.float32
    np.testing.assert_allclose(divergence.numpy(), _numpy_symmetric_kl(first, second, labels),
                               rtol=1e-5, atol=1e-6)
    assert divergence.numpy()[2, 1:].tolist() == [0.0] * 4  # pads weigh 0
    np.testing.assert_array_equal(weights.numpy(), labels != PAD_ID)
    for got, want in zip(tape.gradient(objective, [a, b]), tape.gradient(wanted, [a, b])):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)


def test_symmetric_kl_of_bfloat16_logits_is_float32():
    rng = np.random.default_rng(1)
    first, second = (rng.normal(size=(6, 9)).astype(np.float32) for _ in range(2))
    labels = tf.constant([1, 2, 3, PAD_ID, 4, 5])
    divergence, _ = losses.compiled_symmetric_kl(
        tf.cast(first, tf.bfloat16), tf.cast(second, tf.bfloat16), labels)
    assert divergence.dtype == tf.float32
    rounded = [tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy() for x in (first, second)]
    np.testing.assert_allclose(divergence.numpy(), _numpy_symmetric_kl(*rounded, labels.numpy()),
                               rtol=1e-5, atol=1e-6)


def test_alpha_zero_is_the_one_pass_step_bit_for_bit(tmp_path):
    """rdrop_alpha 0 (the default) takes the one-pass graph: the ops of the step's
    gradients before R-Drop (the gradient of `loss_sums`), and the same loss and
    gradients, bit for bit, with dropout on."""
    assert TrainConfig().rdrop_alpha == 0.0
    step = _trainer(tmp_path, "off", rdrop_alpha=0.0).train_step
    batch = _batch()
    variables = step.model.trainable_variables

    def before(batch, key):
        with tf.GradientTape() as tape:
            loss_sum, tokens = step.loss_sums(batch, key)
            scaled = loss_sum * step.loss_scale_factor()
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        return grads, loss_sum, tokens, step_lib.source_token_count(batch)

    specs = ({k: tf.TensorSpec([None, None], tf.int32) for k in batch}, tf.TensorSpec([], tf.int64))
    ops = [collections.Counter(op.type for op in tf.function(fn, autograph=False)
                               .get_concrete_function(*specs).graph.get_operations())
           for fn in (before, step.grads)]
    assert ops[0] == ops[1]
    (grads_before, *sums_before), (grads_now, *sums_now) = before(batch, KEY), step.grads(batch, KEY)
    assert [float(x) for x in sums_now] == [float(x) for x in sums_before]
    for got, want in zip(grads_now, grads_before, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _losses_of_run(trainer, batches, steps):
    lines = []
    result = trainer.train(dataset_of(batches), max_steps=steps, log_fn=lines.append)
    assert result.step == steps
    return [float(line.split("loss=")[1].split()[0]) for line in lines if "loss=" in line]


def test_without_dropout_both_passes_are_equal_and_add_nothing(tmp_path):
    """Dropout 0: the two passes agree, the divergence is 0, and the step is the one-pass
    step: the same loss sum (the reported loss is the mean of the two passes' CE, hence
    one pass's), tokens and gradients, and the same progress lines' losses."""
    batch = _batch()
    trainers = [_trainer(tmp_path, f"run{alpha}", MODEL, rdrop_alpha=alpha)
                for alpha in (0.0, 5.0)]
    plain, rdrop = (trainer.train_step for trainer in trainers)
    objective, loss_sum, tokens = rdrop.objective_sums(batch, KEY)
    want_loss, want_tokens = plain.loss_sums(batch, KEY)
    assert float(tokens) == float(want_tokens)
    np.testing.assert_allclose(float(loss_sum), float(want_loss), rtol=1e-6)
    assert abs(float(objective) - float(loss_sum)) < 1e-5 * float(loss_sum)
    for got, want in zip(rdrop.grads(batch, KEY)[0], plain.grads(batch, KEY)[0], strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
    batches = [b for pair in STEPS for b in pair]
    runs = [_losses_of_run(trainer, batches, 2) for trainer in trainers]  # not trained above
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


def test_the_two_halves_draw_independent_masks_from_one_key(rdrop_trainer):
    """The doubled rows' halves get different masks (else the divergence would be 0),
    the same ones again for the same key (resume stays exact), others for another key."""
    step = rdrop_trainer.train_step
    batch = _batch()
    inputs = {k: tf.concat([v, v], 0) for k, v in batch.items() if k != "target_out"}
    first, second = tf.split(step.model.states(inputs, training=True, dropout_key=KEY), 2)
    assert np.abs(first.numpy() - second.numpy()).max() > 0.1
    objective, loss_sum, _ = step.rdrop_sums(batch, KEY)
    assert float(objective) > float(loss_sum) + 1e-3  # alpha / 4 * a divergence > 0
    assert [float(x) for x in step.rdrop_sums(batch, KEY)] == [float(objective),
                                                              float(loss_sum), 13.0]
    assert float(step.rdrop_sums(batch, KEY + 1)[0]) != float(objective)


def test_gathered_rows_compare_each_position_with_itself(tmp_path, rdrop_trainer):
    """The CPU path's gathered non-pad rows give the full masked computation's objective,
    loss and gradients: each half's rows pair with the other half's same positions."""
    batch = _batch(5)
    assert rdrop_trainer.step_policy.gather_targets  # CPU's default
    results = []
    for step in (rdrop_trainer.train_step,
                 _trainer(tmp_path, "full", rdrop_alpha=5.0, gather=False).train_step):
        results.append((step.objective_sums(batch, KEY), step.grads(batch, KEY)[0]))
    (sums_gathered, grads_gathered), (sums_full, grads_full) = results
    np.testing.assert_allclose([float(x) for x in sums_gathered],
                               [float(x) for x in sums_full], rtol=1e-5)
    for got, want in zip(grads_gathered, grads_full, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)


def test_accumulation_on_two_replicas_trains_with_a_finite_loss(tmp_path):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    trainer = _trainer(tmp_path, "two", strategy=mirrored, rdrop_alpha=5.0, accum_steps=2)
    before = [v.numpy() for v in trainer.model.trainable_variables]
    batches = [b for pair in STEPS for b in pair]
    losses_two = _losses_of_run(trainer, batches, 1)
    assert len(losses_two) == 1 and np.isfinite(losses_two[0])
    assert any(not np.array_equal(a, v.numpy())
               for a, v in zip(before, trainer.model.trainable_variables))


def test_jit_compiled_gradients_carry_the_divergence(tmp_path, jit_rdrop_trainer):
    """--jit_compile's forward and backward (ReplicaGrads) equal the plain step's with
    R-Drop on and dropout 0 (XLA's random numbers differ from TensorFlow's kernels');
    with dropout the compiled loss is the same for any alpha > 0 (the same two passes)
    and the gradients move with alpha (the divergence's gradient is in them)."""
    batch = _batch()
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    step = _trainer(tmp_path, "equal", MODEL, rdrop_alpha=5.0, jit_compile=True).train_step
    step.prepare(spec)
    got, want = step.replica_grads(batch, KEY), step.grads(batch, KEY)
    assert float(got[2]) == float(want[2])
    np.testing.assert_allclose(float(got[1]), float(want[1]), rtol=1e-5)
    for g, w in zip(got[0], want[0], strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)
    small = _trainer(tmp_path, "a0.001", rdrop_alpha=1e-3, jit_compile=True)
    for weight, shared in zip(small.model.weights, jit_rdrop_trainer.model.weights, strict=True):
        weight.assign(shared)  # the same weights, whether or not the shared trainer has trained
    compiled = []
    for step in (jit_rdrop_trainer.train_step, small.train_step):
        step.prepare(spec)
        compiled.append(step.replica_grads(batch, KEY))
    assert float(compiled[0][1]) == float(compiled[1][1])
    assert max(float(tf.reduce_max(tf.abs(a - b)))
               for a, b in zip(compiled[0][0], compiled[1][0])) > 1e-4


@pytest.mark.parametrize("compiled", ["jit_compile", "compile_step"])
def test_compiled_paths_train_with_a_finite_loss(tmp_path, request, compiled):
    trainer = (request.getfixturevalue("jit_rdrop_trainer") if compiled == "jit_compile"
               else _trainer(tmp_path, "run", rdrop_alpha=5.0, compile_step=True))
    assert trainer.step == 0
    # The batch of the test above: its XLA compilation of this shape serves here too.
    run_losses = _losses_of_run(trainer, [{k: v.numpy() for k, v in _batch().items()}], 1)
    assert np.isfinite(run_losses[0])


def test_mixed_bfloat16_trains_with_a_finite_loss(tmp_path):
    trainer = _trainer(tmp_path, "bf16", rdrop_alpha=5.0, dtype="mixed_bfloat16")
    batch = _batch()
    objective, loss_sum, tokens = trainer.train_step.objective_sums(batch, KEY)
    assert objective.dtype == loss_sum.dtype == tf.float32
    assert float(objective) > float(loss_sum)
    run_losses = _losses_of_run(trainer, [b for pair in STEPS for b in pair], 1)
    assert np.isfinite(run_losses[0])


def test_rdrop_alpha_is_validated_and_set_by_its_flag():
    for bad in (-1.0, float("nan")):
        with pytest.raises(ConfigError, match="rdrop_alpha must be >= 0"):
            TrainConfig(rdrop_alpha=bad)
    # Both command lines parsed in one process (each launch imports TensorFlow).
    script = ("import json, sys\nfrom absl import flags\nfrom tf_transformer import flags as f\n"
              "f.define_model_flags()\nvalues = []\nfor argv in json.loads(sys.argv[1]):\n"
              "    flags.FLAGS.unparse_flags()\n    flags.FLAGS(['x', *argv])\n"
              "    values.append(f.config_from_flags(vocab_size=100).train.rdrop_alpha)\n"
              "print(json.dumps(values))")
    result = subprocess.run([sys.executable, "-c", script, json.dumps([[], ["--rdrop_alpha=5"]])],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [0.0, 5.0]
