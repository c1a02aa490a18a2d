"""The tiny target and draft of run_test's gin files, as T5 configs."""

import fake_models
from spec_decode.models import t5

VOCAB = 128
TARGET = t5.T5Config(
    vocab_size=VOCAB,
    emb_dim=32,
    num_heads=2,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
)
DRAFT = fake_models.tiny_t5(VOCAB)
