"""The label-smoothed loss, old (gather) against new (fused kernel) and compiled (one
XLA program, training's), forward + backward.

  python -m bench.loss_kernel [--preset=small] [--tokens=7000] [--repeats=20]
      [--dtype=float32|bfloat16]

Times one training-step slice on the preset's shapes: the tied output
projection [tokens, d_model] x [d_model, vocab], the loss, and the gradients of
the summed loss with respect to the states and the embedding; and the loss
alone (gradient with respect to the logits). Old and new run alternately in the
same process, so their ratio holds on a loaded machine; --dtype is the logits' and
the projection's (bfloat16: a mixed_bfloat16 step's). Also prints the old and new
versions' op profile (milliseconds by op type, largest first) of the loss alone.
"""

import collections
import time

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags():
    """Only when run: tests import the reference loss beside other flag owners."""
    flags.DEFINE_string("preset", "small", "Preset (d_model and vocab_size).")
    flags.DEFINE_integer("tokens", 7000, "Non-pad target tokens (the small protocol's ~7,100).")
    flags.DEFINE_integer("repeats", 20, "Timed runs per version (median).")
    flags.DEFINE_float("label_smoothing", 0.1, "eps.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Logits' dtype.")


def gathered_cross_entropy(logits, labels, label_smoothing: float):
    """The loss before the fused version: the gold log-probability gathered from a
    log-softmax (its gradient is a dense UnsortedSegmentSum). Same contract as
    losses.smoothed_cross_entropy; kept as the reference its tests compare with."""
    import tensorflow as tf

    from tf_transformer.config import PAD_ID

    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / tf.cast(vocab - 1, tf.float32)
    log_probs = tf.nn.log_softmax(logits)
    target_log_prob = tf.gather(log_probs, labels, axis=-1, batch_dims=len(labels.shape))
    sum_log_probs = tf.reduce_sum(log_probs, axis=-1)
    loss = -(confidence * target_log_prob + low * (sum_log_probs - target_log_prob))
    weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return loss * weights, weights


def _op_profile(loss_fn, logits, labels, eps: float) -> dict[str, float]:
    """Milliseconds per op type of one forward + backward run of `loss_fn` on the
    logits, after Grappler, from a TF1 session's full trace (needs no profiler
    package)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, logits.shape)  # not constants: no folding
        y = tf.compat.v1.placeholder(tf.int32, labels.shape)
        loss = tf.reduce_sum(loss_fn(x, y, eps)[0])
        fetch = [loss, tf.gradients(loss, x)[0][0, 0]]
    with tf.compat.v1.Session(graph=graph) as session:
        feed = {x: logits.numpy(), y: labels.numpy()}
        session.run(fetch, feed)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetch, feed, options=options, run_metadata=metadata)
    totals = collections.Counter()
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            op_type = node.timeline_label.split(" = ")[-1].split("(")[0] or node.node_name
            totals[op_type] += node.op_end_rel_micros / 1000
    return totals


def _seconds(fn, args) -> float:
    start = time.perf_counter()
    fn(*args)[0].numpy()
    return time.perf_counter() - start


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.training import losses

    model = presets.get_preset(FLAGS.preset).model
    n, d, v = FLAGS.tokens, model.d_model, model.vocab_size
    rng = np.random.default_rng(0)
    dtype = tf.as_dtype(FLAGS.dtype)
    states = tf.constant(rng.normal(size=(n, d)), dtype)
    embedding = tf.Variable(rng.normal(scale=d ** -0.5, size=(v, d)), dtype=dtype)
    labels = tf.constant(rng.integers(1, v, size=n), tf.int32)
    logits = tf.constant(rng.normal(size=(n, v)), dtype)
    eps = FLAGS.label_smoothing

    def with_projection(loss_fn):
        @tf.function
        def step(states, labels):
            with tf.GradientTape() as tape:
                tape.watch(states)
                out = tf.matmul(states, embedding, transpose_b=True)
                loss = tf.reduce_sum(loss_fn(out, labels, eps)[0])
            return (loss, *tape.gradient(loss, [states, embedding]))
        return step

    def loss_only(loss_fn):
        @tf.function
        def step(logits, labels):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                loss = tf.reduce_sum(loss_fn(logits, labels, eps)[0])
            return loss, tape.gradient(loss, logits)
        return step

    versions = {"old": gathered_cross_entropy, "new": losses.smoothed_cross_entropy,
                "compiled": losses.compiled_smoothed_cross_entropy}
    for name, (make, args) in {"loss_only": (loss_only, (logits, labels)),
                               "projection_and_loss": (with_projection, (states, labels))}.items():
        fns = {k: make(f) for k, f in versions.items()}
        for fn in fns.values():
            fn(*args)[0].numpy()  # trace and warm up
        times = {k: [] for k in fns}
        for _ in range(FLAGS.repeats):
            for k, fn in fns.items():  # alternate, so load hits both alike
                times[k].append(_seconds(fn, args))
        ms = {k: 1000 * float(np.median(t)) for k, t in times.items()}
        print(f"loss_kernel {name} tokens={n} vocab={v} d_model={d} dtype={FLAGS.dtype} "
              f"forward_backward_ms: old={ms['old']:.1f} new={ms['new']:.1f} "
              f"compiled={ms['compiled']:.1f} speedup={ms['old'] / ms['new']:.2f} "
              f"compiled_vs_new={ms['new'] / ms['compiled']:.2f}")
    for k in ("old", "new"):
        profile = _op_profile(versions[k], tf.cast(logits, tf.float32), labels, eps)
        top = ", ".join(f"{t} {ms:.0f}" for t, ms in profile.most_common(8))
        print(f"  profile {k} loss_only ms: total {sum(profile.values()):.0f}: {top}")

if __name__ == "__main__":
    _define_flags()
    app.run(main)
