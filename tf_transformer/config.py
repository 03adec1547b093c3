"""Frozen configuration: one `Config` flows from flags to layers.

The config is split by concern (model, data, train, decode). Presets are named
after the paper's Table 3 rows. `Config` is pure data: the model directory
(model_dir/layout.py) writes its JSON as config.json, which makes that directory
the single source of truth for export and translation: no hyperparameter is
declared twice.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# Token ids fixed for every vocabulary this project trains (see tokenizer.py).
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
# SentencePiece vocabularies: the algorithms data/vocab.py trains, and the sides a separate
# vocabulary is trained on (tokenizer.py; TensorFlow-free for the binaries' flags).
VOCAB_MODEL_TYPES = ("bpe", "unigram")
VOCAB_SIDES = ("source", "target")

POSITION_KINDS = ("sinusoid", "learned")


class ConfigError(ValueError):
    """A configuration that cannot describe a valid model or run."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The architecture of section 3; names follow the paper.

    `d_k` and `d_v` of 0 mean `d_model // num_heads` (the paper's default);
    Table 3 rows A and B set them explicitly.
    """

    vocab_size: int = 37000
    num_layers: int = 6  # N, for the encoder and the decoder stacks
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8  # h
    d_k: int = 0
    d_v: int = 0
    dropout: float = 0.1  # P_drop: residual and embedding dropout (section 5.4)
    attention_dropout: float = 0.0  # not in the paper; offered for experiments
    relu_dropout: float = 0.0  # inside the FFN, after the ReLU: not in the paper
    positions: str = "sinusoid"  # "sinusoid" (section 3.5) or "learned" (row E)
    max_positions: int = 1024  # table size for learned positions; decode limit
    share_embeddings: bool = True  # source, target and pre-softmax (section 3.4)
    source_vocab_size: int = 0  # only when not sharing; 0 means vocab_size
    pre_norm: bool = False  # normalize first: an addition, off in the paper
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "d_ff", "num_heads",
                     "max_positions"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_k < 0 or self.d_v < 0:
            raise ConfigError("d_k and d_v must be positive (or 0 for d_model/h)")
        if (self.d_k == 0 or self.d_v == 0) and self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set d_k and d_v explicitly or choose a divisor")
        if self.positions not in POSITION_KINDS:
            raise ConfigError(f"positions must be one of {POSITION_KINDS}, got {self.positions!r}")
        if self.positions == "sinusoid" and self.d_model % 2:
            raise ConfigError("sinusoidal positions need an even d_model")
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.share_embeddings and self.source_vocab_size not in (0, self.vocab_size):
            raise ConfigError("source_vocab_size differs from vocab_size but embeddings are shared")
        if self.vocab_size <= EOS_ID:
            raise ConfigError(f"vocab_size must exceed the reserved ids (0..{EOS_ID})")

    @property
    def key_dim(self) -> int:
        return self.d_k or self.d_model // self.num_heads

    @property
    def value_dim(self) -> int:
        return self.d_v or self.d_model // self.num_heads

    @property
    def input_vocab_size(self) -> int:
        return self.source_vocab_size or self.vocab_size

    def with_overrides(self, overrides: dict) -> "ModelConfig":
        """These settings with the user's overrides (ModelConfig fields).

        A preset's explicit d_k/d_v were chosen for its d_model and h, so a new
        d_model or h without a new d_k/d_v sets them back to 0 (d_model/h).
        """
        changes = dict(overrides)
        if changes.keys() & {"d_model", "num_heads"}:
            changes.setdefault("d_k", 0)
            changes.setdefault("d_v", 0)
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Batching of section 5.1: pairs grouped by length under a token budget."""

    max_length: int = 256  # tokens per side, BOS/EOS included; longer pairs are skipped
    tokens_per_batch: int = 4096  # padded positions of the longer side, per replica
    bucket_step: float = 1.1  # geometric growth of bucket boundaries
    min_bucket: int = 8
    bucket_multiple: int = 4  # boundaries rounded up to it; 8 costs ~5% padding here
    shuffle_buffer: int = 20000
    seed: int = 1
    deterministic: bool = False
    # Training batches in a few fixed shapes (Model Garden's static_batch): bucket L
    # always [tokens_per_batch // L, L], short batches filled with PAD rows. The
    # boundaries below max_length (pipeline.best_boundaries on LibreOffice lengths).
    static_batch: bool = False
    static_boundaries: tuple[int, ...] = (8, 16, 24, 32, 48, 72, 120)
    # Training pairs packed into [tokens_per_batch // max_length, max_length] rows with
    # segment and position ids (inputs/packing.py): one static shape, ~5% padding.
    packing: bool = False
    # BPE-dropout of the training pairs (inputs/subword_sampling.py): each merge skipped
    # with this probability, drawn from (seed, pass, line); 0 keeps SentencePiece's own.
    subword_sampling: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "static_boundaries", tuple(self.static_boundaries))  # JSON list
        if not 0.0 <= self.subword_sampling < 1.0:
            raise ConfigError("subword_sampling must be in [0, 1)")
        if any(b < 1 for b in self.static_boundaries):
            raise ConfigError("static_boundaries must be positive")
        if self.static_batch and self.packing:
            raise ConfigError("static_batch and packing are two ways to static shapes: pick one")
        if self.max_length < 2:
            raise ConfigError("max_length must leave room for BOS/EOS")
        if self.tokens_per_batch < self.max_length:
            raise ConfigError(
                f"tokens_per_batch={self.tokens_per_batch} is smaller than max_length="
                f"{self.max_length}: the longest pair would not fit in a batch")
        if self.bucket_step <= 1.0:
            raise ConfigError("bucket_step must be > 1")
        if self.bucket_multiple < 1 or self.min_bucket < 1:
            raise ConfigError("bucket_multiple and min_bucket must be positive")


DECODE_DTYPES = ("float32", "bfloat16", "int8")
# "auto": resolved by training/precision.py before the config is written (never stored).
TRAIN_DTYPES = ("float32", "mixed_bfloat16", "mixed_float16", "auto")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Section 5.3-5.4: Adam, warmup then inverse square root, label smoothing."""

    label_smoothing: float = 0.1  # epsilon_ls
    # R-Drop (Liang et al. 2021): > 0 runs each batch twice and adds this times the
    # symmetric KL of the two passes' outputs (training/step.py); 0: one pass.
    rdrop_alpha: float = 0.0
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0  # multiplies the paper's schedule
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.98
    adam_epsilon: float = 1e-9
    max_steps: int = 100000
    accum_steps: int = 1
    dtype: str = "float32"  # float32 | mixed_bfloat16 | mixed_float16
    jit_compile: bool = False  # forward and backward per micro-batch, one trace for all replicas
    # The whole replica step (forward, backward, loss scaling, all-reduce, Adam) in one
    # XLA program per batch shape (training/compiled_step.py); one replica only.
    compile_step: bool = False
    # Optimizer steps per tf.function call (Orbit's steps_per_loop): the host queues
    # N steps at once; logging, evaluation, checkpoints and max_steps end a call.
    steps_per_call: int = 1
    checkpoint_minutes: float = 10.0
    checkpoint_steps: int = 0  # 0: time-based only
    keep_checkpoints: int = 20
    average_last: int = 5
    keep_best: int = 3  # checkpoints kept in model_dir/best/ by dev score (0: none)
    early_stop: int = 0  # stop after this many evaluations without improvement (0: never)
    divergence_steps: int = 200  # window of the unigram-level divergence warning (0: off)
    log_every: int = 100
    seed: int = 1

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError("label_smoothing must be in [0, 1)")
        if not self.rdrop_alpha >= 0.0:
            raise ConfigError(f"rdrop_alpha must be >= 0 (0: off), got {self.rdrop_alpha}")
        if self.warmup_steps <= 0:
            raise ConfigError("warmup_steps must be positive")
        if self.accum_steps < 1:
            raise ConfigError("accum_steps must be >= 1")
        if self.steps_per_call < 1:
            raise ConfigError("steps_per_call must be >= 1")
        for name in ("keep_best", "early_stop"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        if self.divergence_steps < 0 or self.divergence_steps == 1:
            raise ConfigError("divergence_steps must be 0 (off) or >= 2")
        if self.dtype not in TRAIN_DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Section 6.1: beam 4, length penalty alpha 0.6, max length input + 50."""

    beam_size: int = 4
    alpha: float = 0.6
    extra_length: int = 50
    nbest: int = 1
    batch_size: int = 32
    # Compile the beam search with XLA (translator.py: one compilation per padded
    # batch and source length). Needs --xla_cpu_compilation_enabled in TF Serving.
    jit_compile: bool = False
    # Graph mode: a batch of at least parallel_searches * 8 sentences is searched
    # as this many sub-batches (interleaved by source length), independent loops
    # that the executor runs side by side: one search's step is a chain of small
    # ops that leaves cores idle (BUILD.md, performance decisions). 1: one search.
    parallel_searches: int = 2
    # Weights and matrix products of the Translator: float32, or bfloat16 (half the
    # weights' bytes; products on the CPU's bfloat16 matrix units, AMX, through oneDNN).
    # Scores, softmax statistics, layer norms and the search's arithmetic stay float32.
    # int8: a bfloat16 model whose decoding step projects with int8 weights through
    # oneDNN's quantized matmul (model/quantized.py; graph mode only, no XLA).
    dtype: str = "float32"
    # Graph mode: batches, sources and working rows padded to a fixed set of shapes
    # (search/shape_buckets.py), so a server stops meeting new ones; the export's
    # default. Same outputs, more rows and columns computed.
    bounded_shapes: bool = False

    def __post_init__(self):
        if self.beam_size < 1:
            raise ConfigError("beam_size must be >= 1")
        if self.dtype not in DECODE_DTYPES:
            raise ConfigError(f"decode dtype must be one of {DECODE_DTYPES}, got {self.dtype!r}")
        if self.dtype == "int8" and self.jit_compile:
            raise ConfigError("decode dtype int8 runs in graph mode: XLA (jit_compile) has no "
                              "kernel for its quantized matmul (_QuantizedMatMul)")
        if self.parallel_searches < 1:
            raise ConfigError("parallel_searches must be >= 1")
        if not 1 <= self.nbest <= self.beam_size:
            raise ConfigError(f"nbest must be in [1, beam_size={self.beam_size}]")
        if self.extra_length < 1:
            raise ConfigError("extra_length must be >= 1")

    def with_overrides(self, overrides: dict, all_beams: bool = False) -> "DecodeConfig":
        """These settings with the user's overrides (DecodeConfig fields).

        An nbest the user did not set follows a new beam_size down (it never
        exceeds the beam), or with `all_beams` (the export's translate_nbest
        signature) equals the beam size.
        """
        changes = dict(overrides)
        beam_size = changes.get("beam_size", self.beam_size)
        if "nbest" not in changes:
            changes["nbest"] = beam_size if all_beams else min(self.nbest, beam_size)
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()

    def replace(self, **parts: Any) -> "Config":
        return dataclasses.replace(self, **parts)

    def with_vocab_size(self, vocab_size: int, source_vocab_size: int | None = None) -> "Config":
        """This config for one shared vocabulary of `vocab_size` pieces, or with
        `source_vocab_size` for separate ones (target `vocab_size`; embeddings not shared)."""
        changes: dict = {"vocab_size": vocab_size}
        if source_vocab_size is not None:
            changes.update(share_embeddings=False, source_vocab_size=source_vocab_size)
        return self.replace(model=dataclasses.replace(self.model, **changes))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        raw = json.loads(text)
        parts = {}
        for field in dataclasses.fields(cls):
            part_cls = {"model": ModelConfig, "data": DataConfig,
                        "train": TrainConfig, "decode": DecodeConfig}[field.name]
            known = {f.name for f in dataclasses.fields(part_cls)}
            values = raw.get(field.name, {})
            unknown = set(values) - known
            if unknown:
                raise ConfigError(f"unknown {field.name} config keys: {sorted(unknown)}")
            parts[field.name] = part_cls(**values)
        return cls(**parts)
