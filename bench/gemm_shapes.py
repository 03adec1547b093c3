"""How fast this machine runs the GEMMs of a training step, shape by shape.

  python -m bench.gemm_shapes [--preset=small] [--tokens=4096] [--vocab_size=8000] [--xla]

A step's time is mostly matrix products (bench.profile_train_step), and a
product's speed depends on its shape: the reference peak is a 2048^3 float32
matmul, while a Transformer step multiplies [tokens, d_model] activations by
d_model-wide kernels. For each projection of the preset (forward, and the two
gradient products dX = dY W^T and dW = X^T dY) this prints GFLOP/s and the
fraction of the peak measured in the same run: the ceiling on MFU that these
shapes allow, before any framework overhead. Each figure is the best of
--repeats runs of 10 independent products inside one tf.function (--xla: one
jit_compile function, XLA's own dot). For a decoding step, --tokens=128 (32
sentences x beam 4) under TF_ENABLE_ONEDNN_OPTS=0 gives TF Serving's kernels on
a CPU without AVX-512; output_logits' forward is also timed with the table
transposed once (forward_pretransposed), as the graph search does.
"""

import time

from absl import app, flags

flags.DEFINE_string("preset", "small", "Preset.")
flags.DEFINE_integer("tokens", 4096, "Rows: tokens per batch (one side).")
flags.DEFINE_integer("vocab_size", 8000, "Output layer width.")
flags.DEFINE_integer("repeats", 5, "Timed runs per shape (best).")
flags.DEFINE_bool("xla", False, "Products in a jit_compile function (XLA's dot).")
FLAGS = flags.FLAGS


def _gflops(m: int, k: int, n: int, transpose_a=False, transpose_b=False) -> float:
    import tensorflow as tf

    a = [tf.random.normal([k, m] if transpose_a else [m, k]) for _ in range(10)]
    b = tf.random.normal([n, k] if transpose_b else [k, n])

    @tf.function(jit_compile=FLAGS.xla)
    def chain(a, b):  # ten independent products (distinct inputs), one dispatch
        return tf.add_n([tf.matmul(x, b, transpose_a=transpose_a, transpose_b=transpose_b)[0, 0]
                         for x in a])

    chain(a, b).numpy()
    best = float("inf")
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        chain(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 10 * 2 * m * k * n / best / 1e9


def main(argv):
    del argv
    import tensorflow as tf

    import tf_transformer  # noqa: F401  (oneDNN on, as in training)
    from bench.timing import matmul_peak
    from tf_transformer import presets

    model = presets.get_preset(FLAGS.preset, FLAGS.vocab_size).model
    d, f, h = model.d_model, model.d_ff, model.num_heads
    t = FLAGS.tokens
    peak = matmul_peak(tf.float32) / 1e9
    print(f"gemm_shapes preset={FLAGS.preset} tokens={t} xla={FLAGS.xla} "
          f"peak_2048^3={peak:.1f} GFLOP/s")
    projections = {  # name: (in, out) of a [t, in] x [in, out] product
        "self_qkv": (d, h * (2 * model.key_dim + model.value_dim)),
        "attention_out": (h * model.value_dim, d),
        "cross_kv": (d, h * (model.key_dim + model.value_dim)),
        "ffn_in": (d, f),
        "ffn_out": (f, d),
        "output_logits": (d, FLAGS.vocab_size),
    }
    for name, (k, n) in projections.items():
        if name == "output_logits":  # the shared embedding E [n, k]: X E^T
            forward = _gflops(t, k, n, transpose_b=True)
            grad_x = _gflops(t, n, k)  # dY [t, n] x E
            grad_w = _gflops(n, t, k, transpose_a=True)  # dY^T x X
        else:
            forward = _gflops(t, k, n)
            grad_x = _gflops(t, n, k, transpose_b=True)  # dY [t, n] x W^T
            grad_w = _gflops(k, t, n, transpose_a=True)  # X^T [k, t] x dY [t, n]
        print(f"gemm {name} [{t},{k}]x[{k},{n}] forward={forward:.1f} ({forward / peak:.2f}) "
              f"grad_x={grad_x:.1f} ({grad_x / peak:.2f}) grad_w={grad_w:.1f} "
              f"({grad_w / peak:.2f}) GFLOP/s (fraction of peak)", flush=True)
        if name == "output_logits":
            once = _gflops(t, k, n)
            print(f"gemm {name} forward_pretransposed={once:.1f} ({once / peak:.2f})", flush=True)


if __name__ == "__main__":
    app.run(main)
