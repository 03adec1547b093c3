"""float16 with loss scaling and bfloat16: skipped steps are counted, never fatal."""

import numpy as np
import tensorflow as tf
from trainer_fixtures import STEPS, concat_batches, dataset_of, read_scalars, train_config

from tf_transformer.training.trainer import Trainer


def test_float16_overflow_skips_a_step_and_training_goes_on(tmp_path):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    trainer = Trainer(train_config(dtype="mixed_float16"), str(tmp_path), mirrored)
    # Forced overflow: float16 gradients of a loss scaled by 2^18 are inf (float16's
    # largest is 65504, under 2^16), so the optimizer skips steps (halving the scale each
    # time) until they are finite. (Each skip is a float16 step, slow on a CPU.)
    trainer.optimizer.dynamic_scale.assign(2.0 ** 18)
    lines = []
    result = trainer.train(dataset_of([b for pair in STEPS for b in pair]), max_steps=3,
                           log_fn=lines.append)
    assert result.step == 3 and result.skipped_steps >= 1, result.skipped_steps
    first = lines[0].split()
    fields = dict(field.split("=") for field in first)
    assert first[0] == "step=1" and int(fields["skipped_steps"]) == result.skipped_steps
    assert float(fields["loss_scale"]) == 2.0 ** (18 - result.skipped_steps)
    assert float(fields["ms_per_step"]) > 0
    scalars = read_scalars(str(tmp_path / "train"))
    assert scalars["skipped_steps"][3] == result.skipped_steps
    assert scalars["loss_scale"][1] == 2.0 ** (18 - result.skipped_steps)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")


def _losses(tmp_path, dtype, steps=20):
    lines = []
    trainer = Trainer(train_config(dtype=dtype, warmup_steps=5, learning_rate_scale=4.0),
                      str(tmp_path / dtype), tf.distribute.OneDeviceStrategy("/cpu:0"))
    trainer.train(dataset_of([concat_batches(*pair) for pair in STEPS]), max_steps=steps,
                  log_fn=lines.append)
    # bfloat16 keeps float32's exponent: no loss scaling, no skipped step.
    assert all("skipped_steps=0" in l and "loss_scale=" not in l for l in lines)
    return np.array([float(l.split("loss=")[1].split()[0]) for l in lines])


def test_bfloat16_loss_falls_like_float32(tmp_path):
    full, bf16 = _losses(tmp_path, "float32"), _losses(tmp_path, "mixed_bfloat16")
    assert len(bf16) == len(full) == 20
    # Random targets: the loss falls from ~log(30) towards ~log(26) (3.26).
    assert full[-5:].mean() < 0.85 * full[:3].mean()
    assert bf16[-5:].mean() < 0.85 * bf16[:3].mean()
    # Measured: bfloat16 within 3% of float32 at every step.
    np.testing.assert_allclose(bf16, full, rtol=0.05)
