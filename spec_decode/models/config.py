"""T5 hyperparameters, bound from gin files under configs/models/."""

import dataclasses

import gin
import jax.numpy as jnp


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config:
  """The hyperparameters of one T5 model.

  The defaults are T5 1.1 small's except the vocabulary, which every run must
  bind. T5 1.0 differs by `mlp_activations=('relu',)` and
  `logits_via_embedding=True`.

  Attributes:
    vocab_size: number of token ids (32128 for the public T5 checkpoints).
    emb_dim: width of the residual stream.
    num_heads: attention heads per layer.
    head_dim: width of one head.
    mlp_dim: width of the MLP's hidden layer.
    num_encoder_layers: encoder depth; 0 for a shared-encoder draft.
    num_decoder_layers: decoder depth.
    mlp_activations: ('gelu', 'linear') is T5 1.1's gated GELU, ('relu',) is
      T5 1.0's MLP.
    logits_via_embedding: T5 1.0 computes logits through the tied token
      embedding, rescaled by emb_dim**-0.5; T5 1.1 has its own `logits_dense`.
    num_buckets: relative position buckets per stack.
    max_distance: the distance from which all positions share one bucket.
    dropout_rate: dropout in training; decoding never uses it.
    dtype: activation and parameter dtype name ('float32' or 'bfloat16');
      norms and attention softmax stay in float32. 'auto' takes the
      checkpoint's stored dtype (`pair.model_config` resolves it: bfloat16
      for a Hugging Face checkpoint stored in bfloat16, else float32).
    logits_dtype: the dtype of T5 1.1's `logits_dense` output; 'float32'
      by default whatever `dtype` is, accumulated in float32 from the
      weights as stored (bfloat16 weights are not copied to float32; T5
      1.0's logits via the embedding are the same). 'bfloat16' computes in
      bfloat16; it exists to measure what float32 logits buy (see the
      README's known limits).
    shared_encoder_dim: 0 for a T5 with an encoder of its own. Else a
      shared-encoder draft: a decoder with no encoder, which cross-attends
      to its target's encoder output (of this width, the target's emb_dim)
      through a learned projection to emb_dim (`Transformer.encode`).
    attention_buckets: with more than 1, the decode loops split the cache's
      capacity into this many static key bounds and run one while loop per
      bound, so that each call's self-attention reads the cache up to its
      bound rather than its whole capacity (`spec_decode/key_buckets.py`).
      Each bound is a compiled loop body; 1 (the whole capacity at every
      call, one body) suits models whose cache is a small part of what a
      call reads, as the demo pair's.
    transposed_kernels: store every projection's kernel as [out, in], its
      logical axes reversed, and contract on its last axis. The product is
      the same; XLA:CPU computes it for a few rows much faster than from
      t5x's [in, out] (the 48.2M demo target on a Zen 2 CPU: a 5-token
      call 10.9 ms instead of 16.7, a step 5.0 instead of 5.8). A
      checkpoint stays in t5x's layout: `pair.load_model` transposes the
      kernels as it loads them (`t5.transpose_kernels`).
    few_rows_kernel: with transposed_kernels, a float32 product of at most 64
      rows runs in spec_decode's CPU kernel: up to 16 rows (a decode call at
      batch 1 and gamma < 16, or at batch 8 and gamma 1) reading each kernel
      once for all its rows, 17-64 rows (an encoder's input at batch 1, a
      verification call at batch 8) in register tiles
      (`spec_decode/kernels/few_rows.py`); on other platforms, or where it
      does not compile, XLA's dot. The sums match to float32 rounding.
    per_query_attention: a decoder call of 2-16 tokens (a verification call,
      a draft's 2-token chunk) attends one query at a time, as that many
      1-token calls would. On a CPU, XLA ran the batched attention of 2-5
      queries 2.0-4.9 times as long as the same queries one at a time
      (README, "A twenty-first session: attention one query at a time"); on
      an accelerator one batched dot is the better program.
    attention_kernel: a decoder call's attention of at most 16 queries runs
      in float32 in spec_decode's CPU kernel, all its rows, queries and heads
      in one custom call, each query as in a call with it alone
      (`spec_decode/kernels/few_queries.py`); XLA:CPU runs it as about eight
      small ops per query and layer. On other platforms, or where it does
      not compile, XLA's ops.
  """

  vocab_size: int = gin.REQUIRED
  emb_dim: int = 512
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 1024
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  mlp_activations: tuple[str, ...] = ("gelu", "linear")
  logits_via_embedding: bool = False
  num_buckets: int = 32
  max_distance: int = 128
  dropout_rate: float = 0.0
  dtype: str = "float32"
  logits_dtype: str = "float32"
  shared_encoder_dim: int = 0
  attention_buckets: int = 1
  transposed_kernels: bool = False
  few_rows_kernel: bool = False
  per_query_attention: bool = False
  attention_kernel: bool = False

  def __post_init__(self):
    for name in (
        "vocab_size",
        "emb_dim",
        "num_heads",
        "head_dim",
        "mlp_dim",
        "num_decoder_layers",
        "num_buckets",
        "max_distance",
        "attention_buckets",
    ) + (() if self.shared_encoder_dim else ("num_encoder_layers",)):
      if int(getattr(self, name)) < 1:
        raise ValueError(
            f"T5Config.{name} must be >= 1, got " f"{getattr(self, name)}"
        )
    if self.shared_encoder_dim < 0:
      raise ValueError(
          "T5Config.shared_encoder_dim must be >= 0, got "
          f"{self.shared_encoder_dim}"
      )
    if self.shared_encoder_dim and self.num_encoder_layers:
      raise ValueError(
          "T5Config.num_encoder_layers must be 0 for a shared-encoder draft "
          f"(shared_encoder_dim {self.shared_encoder_dim}), got "
          f"{self.num_encoder_layers}"
      )
    known = {"gelu", "relu", "linear", "silu"}
    unknown = set(self.mlp_activations) - known
    if unknown:
      raise ValueError(
          f"T5Config.mlp_activations: unknown {sorted(unknown)}; "
          f"known: {sorted(known)}"
      )
    for name, allowed in (
        ("dtype", ("float32", "bfloat16", "auto")),
        ("logits_dtype", ("float32", "bfloat16")),
    ):
      if getattr(self, name) not in allowed:
        raise ValueError(
            f"T5Config.{name} must be one of {allowed}, got "
            f"{getattr(self, name)!r}"
        )
    for name in (
        "transposed_kernels",
        "few_rows_kernel",
        "per_query_attention",
        "attention_kernel",
    ):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(
            f"T5Config.{name} must be True or False, got "
            f"{getattr(self, name)!r}"
        )
    if self.few_rows_kernel and not self.transposed_kernels:
      raise ValueError(
          "T5Config.few_rows_kernel needs T5Config.transposed_kernels = True "
          "(the kernel reads [out, in] weights)"
      )
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))

  @property
  def activation_dtype(self):
    if self.dtype == "auto":
      raise ValueError(
          "T5Config.dtype 'auto' is resolved from a checkpoint "
          "(pair.model_config); this config was not"
      )
    return jnp.dtype(self.dtype)
