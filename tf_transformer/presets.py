"""Named presets: the paper's Table 3 rows, plus `tiny` and `small` for CPU work.

`python -m tf_transformer.presets --vocab_size=37000` prints every preset as a
tab-separated table, with the exact trainable parameter count of the built
model in `params`.

Names: `base`, `big`; Table 3 variant rows as `<row>_<change>` (`a_h1` = row A
with h=1, `b_dk16`, `c_n2`, `c_dmodel256`, `c_dff4096`, `d_pdrop0`,
`d_ls02` = label smoothing 0.2, `e_learned`); `tiny` (2+2 layers, d_model 128: the
demo, and the best model for a 25-minute CPU budget) and `small` (2+2 layers, d_model
256, 4 heads, d_ff 1024: within 2 dev BLEU of `tiny` at 25 minutes, and more room over
hours; the side-by-side protocol pins 3+3 in its recipe). Both are pre-norm with warmup
400, `tiny` with 2048 tokens per step, chosen for a CPU budget: the paper presets keep
the paper's schedule and post-norm.
"""

from __future__ import annotations

from tf_transformer import process_defaults
from tf_transformer.config import Config, ConfigError, DataConfig, ModelConfig, TrainConfig

# Table 3: what each row changes from base, and the paper's params column
# (millions; None where the paper leaves it blank).
_ROWS: dict[str, tuple[dict, dict, float | None]] = {
    "base": ({}, {}, 65),
    "a_h1": ({"num_heads": 1, "d_k": 512, "d_v": 512}, {}, None),
    "a_h4": ({"num_heads": 4, "d_k": 128, "d_v": 128}, {}, None),
    "a_h16": ({"num_heads": 16, "d_k": 32, "d_v": 32}, {}, None),
    "a_h32": ({"num_heads": 32, "d_k": 16, "d_v": 16}, {}, None),
    "b_dk16": ({"d_k": 16}, {}, 58),
    "b_dk32": ({"d_k": 32}, {}, 60),
    "c_n2": ({"num_layers": 2}, {}, 36),
    "c_n4": ({"num_layers": 4}, {}, 50),
    "c_n8": ({"num_layers": 8}, {}, 80),
    "c_dmodel256": ({"d_model": 256, "d_k": 32, "d_v": 32}, {}, 28),
    "c_dmodel1024": ({"d_model": 1024, "d_k": 128, "d_v": 128}, {}, 168),
    "c_dff1024": ({"d_ff": 1024}, {}, 53),
    "c_dff4096": ({"d_ff": 4096}, {}, 90),
    "d_pdrop0": ({"dropout": 0.0}, {}, None),
    "d_pdrop02": ({"dropout": 0.2}, {}, None),
    "d_ls0": ({}, {"label_smoothing": 0.0}, None),
    "d_ls02": ({}, {"label_smoothing": 0.2}, None),
    "e_learned": ({"positions": "learned"}, {}, None),
    "big": ({"d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout": 0.3},
            {"max_steps": 300000, "average_last": 20}, 213),
}

# (model, train, data) changes. Both schedules are the best of the dev-split sweep at 25
# minutes on 2 cores (bench/results/quality.md, the schedule sweeps): the paper's 4000 warmup steps never end in
# such a budget, and post-norm collapses at the peak learning rate they need.
_CPU = {
    # Pre-norm, warmup 400 (peak 4.4e-3) and 2048 tokens per step: the sweep's best setting
    # (`tiny_t2048_pre`), twice the steps of 4096-token batches in the same minutes.
    "tiny": ({"num_layers": 2, "d_model": 128, "d_ff": 512, "num_heads": 4, "vocab_size": 8000,
              "pre_norm": True},
             {"warmup_steps": 400}, {"tokens_per_batch": 2048}),
    # Pre-norm and warmup 400 (peak 3.1e-3): the best `small` schedule (`w400_pre`); 2+2
    # layers (`n2_pre`): 18.79 dev BLEU at 25 minutes against 3+3's 16.23 and `tiny`'s 20.78.
    "small": ({"num_layers": 2, "d_model": 256, "d_ff": 1024, "num_heads": 4, "vocab_size": 8000,
               "pre_norm": True},
              {"warmup_steps": 400}, {}),
}

PAPER_PARAMS_MILLIONS = {name: row[2] for name, row in _ROWS.items() if row[2] is not None}
PAPER_VOCAB_SIZE = 37000


def preset_names() -> list[str]:
    return list(_ROWS) + list(_CPU)


def get_preset(name: str, vocab_size: int | None = None) -> Config:
    """The Config of a named preset; `vocab_size` overrides the preset's."""
    data_changes = {}
    if name in _ROWS:
        model_changes, train_changes, _ = _ROWS[name]
        model_changes = {"vocab_size": PAPER_VOCAB_SIZE, **model_changes}
    elif name in _CPU:
        model_changes, train_changes, data_changes = _CPU[name]
    else:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    if vocab_size is not None:
        model_changes = {**model_changes, "vocab_size": vocab_size}
    return Config(model=ModelConfig(**model_changes), data=DataConfig(**data_changes),
                  train=TrainConfig(**train_changes))


def closed_form_params(m: ModelConfig) -> int:
    """Trainable parameters from the hyperparameters alone.

    Counts: one shared embedding (no separate softmax matrix, no output bias);
    per attention block the Q, K, V, O projections with biases; per FFN W1, b1,
    W2, b2; two LayerNorm vectors (gain, bias) per sub-layer; a final LayerNorm
    per stack only with pre_norm; a learned position table when positions are
    learned (one per embedding). Sinusoids have no parameters.
    """
    d, h, dk, dv = m.d_model, m.num_heads, m.key_dim, m.value_dim
    attention = d * h * dk + h * dk + d * h * dk + h * dk + d * h * dv + h * dv + h * dv * d + d
    ffn = d * m.d_ff + m.d_ff + m.d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    stacks = m.num_layers * (encoder_layer + decoder_layer) + (2 * norm if m.pre_norm else 0)
    tables = 1 if m.share_embeddings else 2
    embeddings = m.vocab_size * d + (0 if m.share_embeddings else m.input_vocab_size * d)
    positions = tables * m.max_positions * d if m.positions == "learned" else 0
    return embeddings + positions + stacks


def table_rows(vocab_size: int) -> list[dict]:
    from tf_transformer.model import build_model  # TensorFlow only when printing

    rows = []
    for name in preset_names():
        config = get_preset(name, vocab_size)
        m, t = config.model, config.train
        model = build_model(m)
        rows.append({
            "name": name, "N": m.num_layers, "d_model": m.d_model, "d_ff": m.d_ff,
            "h": m.num_heads, "d_k": m.key_dim, "d_v": m.value_dim, "P_drop": m.dropout,
            "eps_ls": t.label_smoothing, "positions": m.positions,
            "train_steps": t.max_steps, "params": model.count_params(),
            "paper_params_M": PAPER_PARAMS_MILLIONS.get(name, "")})
        del model
    return rows


def format_table(rows: list[dict]) -> str:
    """`table_rows` as tab-separated lines: the keys as a header, then one line per row."""
    lines = ["\t".join(rows[0])] + ["\t".join(str(v) for v in row.values()) for row in rows]
    return "\n".join(lines) + "\n"


def main(argv, vocab_size: int = PAPER_VOCAB_SIZE):
    """The `python -m tf_transformer.presets` table, every preset at `vocab_size`."""
    del argv
    process_defaults.apply()  # before TensorFlow's import (table_rows builds each preset)
    print(format_table(table_rows(vocab_size)), end="")


if __name__ == "__main__":  # the binary: its one flag is read here and passed in
    from absl import app, flags

    flags.DEFINE_integer("vocab_size", PAPER_VOCAB_SIZE, "Shared vocabulary size for every preset.")
    app.run(lambda argv: main(argv, flags.FLAGS.vocab_size))
