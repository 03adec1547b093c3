"""Model FLOPs of a training step, counted matmul by matmul (for MFU figures).

Counts 2 FLOPs per multiply-add of every projection, attention product and
the output projection, for the shapes given; a training step is 3x the
forward pass (the backward pass computes two products per forward product).
Embedding lookups, softmax, layer norms and elementwise ops are not counted,
as is usual for model FLOPs utilisation.
"""

from tf_transformer.config import ModelConfig


def forward_flops(m: ModelConfig, batch: int, source_length: int, target_length: int) -> int:
    """FLOPs of one forward pass over [batch, S] sources and [batch, T] targets."""
    d, h, dk, dv, ff = m.d_model, m.num_heads, m.key_dim, m.value_dim, m.d_ff
    s, t = batch * source_length, batch * target_length  # token positions

    def self_attention(tokens, length):
        projections = 2 * tokens * d * h * (2 * dk + dv) + 2 * tokens * h * dv * d
        products = 2 * tokens * h * length * (dk + dv)
        return projections + products

    ffn = lambda tokens: 2 * tokens * 2 * d * ff  # noqa: E731
    encoder_layer = self_attention(s, source_length) + ffn(s)
    cross = (2 * t * d * h * dk + 2 * s * d * h * (dk + dv) + 2 * t * h * dv * d
             + 2 * t * h * source_length * (dk + dv))
    decoder_layer = self_attention(t, target_length) + cross + ffn(t)
    output = 2 * t * d * m.vocab_size
    return m.num_layers * (encoder_layer + decoder_layer) + output


def train_step_flops(m: ModelConfig, batch: int, source_length: int, target_length: int) -> int:
    return 3 * forward_flops(m, batch, source_length, target_length)
