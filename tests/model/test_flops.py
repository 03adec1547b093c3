"""The model FLOPs counter against a hand count."""

from tf_transformer.config import ModelConfig
from tf_transformer.model import flops


def test_forward_flops_by_hand():
    m = ModelConfig(vocab_size=10, num_layers=1, d_model=4, d_ff=8, num_heads=2)  # d_k = d_v = 2
    b, s, t = 1, 3, 2
    # encoder: QKV 3*(2*3*4*4) + O 2*3*4*4 + QK^T,AV 2*2*(2*3*3*2) + FFN 2*(2*3*4*8)
    encoder = 3 * 96 + 96 + 2 * 72 + 2 * 192
    # decoder self: QKV 3*(2*2*4*4) + O 64 + products 2*(2*2*2*2*2); cross: Q 64, KV 2*96, O 64,
    # products 2*(2*2*2*3*2); FFN 2*(2*2*4*8)
    decoder = 3 * 64 + 64 + 2 * 32 + 64 + 2 * 96 + 64 + 2 * 48 + 2 * 128
    output = 2 * 2 * 4 * 10
    assert flops.forward_flops(m, b, s, t) == encoder + decoder + output
    assert flops.train_step_flops(m, b, s, t) == 3 * (encoder + decoder + output)
