"""The floor of a training step: its matrix products alone, against the whole step.

  python -m bench.gemm_floor [--preset=small] [--length=48] [--tokens_per_batch=4096]
      [--steps=5] [--vocab_size=8000]

Every product of one training step of the preset on a fixed [B, L] batch (B =
tokens_per_batch // L, no padding), each forward product with its two gradient
products, with the model's own shapes: the Q/K/V, output, cross-attention and
FFN projections as 2-D GEMMs over the batch's tokens, the attention products
Q K^T and A V as batched products per head, and the tied output layer against
the [vocab, d_model] table. Nothing else: no softmax, layer norm, dropout,
loss, optimizer or framework op between them. The products run as
independent ops of one tf.function (graph mode, oneDNN) and then as one XLA
program (--xla=false skips it), timed against the trainer's own step on the
same batch in the same process (graph step, and with --compile_step the whole
step compiled). step_ms / gemm_ms is the most that removing every non-product
op could gain: a speed-up beyond it needs fewer FLOPs or faster products.
"""

import time

from absl import app, flags

from bench import timing
from bench.timing import define_step_flags

flags.DEFINE_string("preset", "small", "Preset.")
flags.DEFINE_integer("vocab_size", 8000, "Output layer width.")
flags.DEFINE_bool("xla", True, "Also time the products as one XLA program.")
flags.DEFINE_bool("compile_step", True, "Also time the whole step compiled (TrainConfig).")
define_step_flags(5, "Timed runs of each (after 2 warm-up runs; median).",
                  "Tokens per side per batch.")
flags.adopt_module_key_flags(timing)
FLAGS = flags.FLAGS


def step_products(model, batch: int, length: int, vocab: int) -> list:
    """[(a_shape, b_shape, transpose_a, transpose_b)] of every product of one step,
    forward and both gradients (the same products flops.train_step_flops counts)."""
    d, h, dk, dv, f = model.d_model, model.num_heads, model.key_dim, model.value_dim, model.d_ff
    t = batch * length
    products = []

    def dense(m, k, n):  # Y = X W: forward, dX = dY W^T, dW = X^T dY
        products.extend([([m, k], [k, n], False, False), ([m, n], [k, n], False, True),
                         ([m, k], [m, n], True, False)])

    def attention(q_length, k_length):  # S = Q K^T, O = A V; each with its two gradients
        q, k, v = [batch, h, q_length, dk], [batch, h, k_length, dk], [batch, h, k_length, dv]
        s = [batch, h, q_length, k_length]
        products.extend([(q, k, False, True), (s, k, False, False), (s, q, True, False),
                         (s, v, False, False), ([batch, h, q_length, dv], v, False, True),
                         (s, [batch, h, q_length, dv], True, False)])

    for _ in range(model.num_layers):  # encoder
        dense(t, d, h * (2 * dk + dv)), attention(length, length), dense(t, h * dv, d)
        dense(t, d, f), dense(t, f, d)
    for _ in range(model.num_layers):  # decoder
        dense(t, d, h * (2 * dk + dv)), attention(length, length), dense(t, h * dv, d)
        dense(t, d, h * dk), dense(t, d, h * (dk + dv)), attention(length, length)
        dense(t, h * dv, d), dense(t, d, f), dense(t, f, d)
    # The tied output layer: logits = X E^T, dX = dY E, dE = dY^T X.
    products.extend([([t, d], [vocab, d], False, True), ([t, vocab], [vocab, d], False, False),
                     ([t, vocab], [t, d], True, False)])
    return products


def _median_ms(fn, runs: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def main(argv):
    del argv
    import tensorflow as tf

    import tf_transformer  # noqa: F401  (oneDNN on, as in training)
    from bench.timing import make_step, matmul_peak
    from tf_transformer import presets

    model = presets.get_preset(FLAGS.preset, FLAGS.vocab_size).model
    batch = FLAGS.tokens_per_batch // FLAGS.length
    products = step_products(model, batch, FLAGS.length, FLAGS.vocab_size)
    flops = 0
    operands = []
    for a_shape, b_shape, transpose_a, transpose_b in products:
        a, b = tf.random.normal(a_shape), tf.random.normal(b_shape)
        m = a_shape[-1] if transpose_a else a_shape[-2]
        k = a_shape[-2] if transpose_a else a_shape[-1]
        n = b_shape[-2] if transpose_b else b_shape[-1]
        flops += 2 * m * k * n * (a_shape[0] * a_shape[1] if len(a_shape) == 4 else 1)
        operands.append((a, b, transpose_a, transpose_b))

    def all_products():
        return [tf.matmul(a, b, transpose_a=ta, transpose_b=tb) for a, b, ta, tb in operands]

    peak = matmul_peak(tf.float32)
    print(f"gemm_floor preset={FLAGS.preset} batch={batch}x{FLAGS.length} "
          f"products={len(products)} gflop={flops / 1e9:.1f} peak={peak / 1e9:.1f} GFLOP/s",
          flush=True)
    figures = {}
    for name, jit in (("graph", False), ("xla", True)):
        if jit and not FLAGS.xla:
            continue
        run = tf.function(all_products, jit_compile=jit)
        ms = _median_ms(lambda: [x.numpy() for x in run()[-1:]], FLAGS.steps)
        figures[f"gemm_{name}"] = ms
        print(f"products_only mode={name} ms={ms:.0f} gflops={flops / ms / 1e6:.1f} "
              f"fraction_of_peak={flops / ms / 1e6 / (peak / 1e9):.2f}", flush=True)
    for name, compiled in (("graph_step", False), ("compiled_step", True)):
        if compiled and not FLAGS.compile_step:
            continue
        step = make_step(FLAGS.preset, "float32", False, FLAGS.length, FLAGS.tokens_per_batch,
                         FLAGS.vocab_size, compile_step=compiled)
        ms = _median_ms(step.run, FLAGS.steps)
        best = min(v for k, v in figures.items() if k.startswith("gemm_"))
        print(f"trainer_step mode={name} ms={ms:.0f} model_gflop={step.model_flops / 1e9:.1f} "
              f"mfu={step.model_flops / ms / 1e6 / (peak / 1e9):.3f} "
              f"step_over_products={ms / best:.2f}", flush=True)


if __name__ == "__main__":
    app.run(main)
