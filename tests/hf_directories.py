"""Hugging Face checkpoint directories as users have them, saved by transformers.

Tiny random models of each family (T5 1.0, T5 1.1 / Flan-T5, mT5, and the
refused umT5 and LongT5), saved with `save_pretrained`; a SentencePiece
model trained here on made-up sentences; and a Flax `flax_model.msgpack`
written from a torch model by the modules' own types, independently of
spec_decode's name table.
"""

import os
import random

from flax import serialization
import numpy as np
import sentencepiece as spm
import torch
import transformers

# Dimensions small enough for 2 CPU cores; relative-attention settings other
# than the defaults, so that a config read wrongly shows in the logits.
_DIMS = dict(
    d_model=16,
    d_kv=4,
    d_ff=32,
    num_layers=2,
    num_decoder_layers=1,
    num_heads=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
    dropout_rate=0.0,
)
# Family -> (transformers config class, model class).
FAMILIES = {
    "t5_1_0": (transformers.T5Config, transformers.T5ForConditionalGeneration),
    "t5_1_1": (transformers.T5Config, transformers.T5ForConditionalGeneration),
    "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration),
    "umt5": (
        transformers.UMT5Config,
        transformers.UMT5ForConditionalGeneration,
    ),
    "longt5": (
        transformers.LongT5Config,
        transformers.LongT5ForConditionalGeneration,
    ),
}
# Pieces of the SentencePiece model trained here; with T5's 100 extra ids it
# has 400 ids.
SPM_PIECES = 300
_SYLLABLES = (
    "ka ne ru mo ti sa lö über ß ph qu x ing tion en er Ä ç 7 ou ei".split()
)


def save_model(
    family, directory, vocab_size=64, weight_std=None, seed=0, **dims
):
  """Saves a random model of `family` to `directory`; returns it (eval mode).

  Args:
    family: a key of FAMILIES.
    directory: where `save_pretrained` writes.
    vocab_size: the model's ids.
    weight_std: if set, every weight is drawn from N(0, weight_std) instead of
      transformers' tiny initialization, so that greedy outputs vary.
    seed: torch's seed.
    **dims: transformers config fields that replace the tiny defaults.

  Returns:
    The transformers model. T5 1.1 and mT5 get an lm_head of their own (as
    the published checkpoints have); T5 1.0 ties it to the embedding.
  """
  config_class, model_class = FAMILIES[family]
  proj = "relu" if family == "t5_1_0" else "gated-gelu"
  kwargs = dict(_DIMS, vocab_size=vocab_size, feed_forward_proj=proj)
  kwargs.update(dims)
  if family == "t5_1_1":
    kwargs["tie_word_embeddings"] = False
  torch.manual_seed(seed)
  model = model_class(config_class(**kwargs)).eval()
  if weight_std is not None:
    with torch.no_grad():
      for param in model.parameters():
        param.normal_(0.0, weight_std)
  if family in ("t5_1_1", "mt5"):
    model.lm_head.weight = torch.nn.Parameter(
        torch.randn(vocab_size, kwargs["d_model"]) * (weight_std or 1.0)
    )
    model.all_tied_weights_keys.pop("lm_head.weight", None)
  model.save_pretrained(directory)
  return model


def save_flax(model, directory):
  """Writes `model`'s weights as FlaxT5ForConditionalGeneration saves them.

  Flax's Dense layers hold `kernel` [in, out], the transpose of torch's
  Linear weight; its embeddings hold `embedding`; its RMS norms `weight`.
  Flax has no copies of the shared embedding, and T5 1.0 has no lm_head.
  """
  tree = {}
  for name, tensor in model.state_dict().items():
    module_name, _, _ = name.rpartition(".")
    if ".embed_tokens" in name or (
        name == "lm_head.weight" and model.config.scale_decoder_outputs
    ):
      continue
    module = model.get_submodule(module_name)
    array = tensor.detach().numpy()
    if isinstance(module, torch.nn.Linear):
      leaf, array = "kernel", array.T
    elif isinstance(module, torch.nn.Embedding):
      leaf = "embedding"
    else:
      leaf = "weight"
    node = tree
    for part in module_name.split("."):
      node = node.setdefault(part, {})
    node[leaf] = np.ascontiguousarray(array)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "flax_model.msgpack"), "wb") as f:
    f.write(serialization.msgpack_serialize(tree))


def sentences(count, seed):
  """`count` made-up sentences of accented syllables, digits, punctuation."""
  rng = random.Random(seed)
  words = [
      "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
      for _ in range(400)
  ]
  lines = []
  for _ in range(count):
    words_in_line = [rng.choice(words) for _ in range(rng.randint(3, 15))]
    end = rng.choice([".", "?", "!", ",  ok", " 42.", ""])
    lines.append(" ".join(words_in_line).capitalize() + end)
  return lines


def train_spiece(directory):
  """Trains a SentencePiece model as T5's (pad 0, EOS 1, UNK 2, no BOS).

  Returns:
    The path of `directory`/spiece.model.
  """
  os.makedirs(directory, exist_ok=True)
  corpus = os.path.join(directory, "corpus.txt")
  with open(corpus, "w") as f:
    f.write("\n".join(sentences(2000, seed=0)))
  spm.SentencePieceTrainer.train(
      input=corpus,
      model_prefix=os.path.join(directory, "spiece"),
      vocab_size=SPM_PIECES,
      pad_id=0,
      eos_id=1,
      unk_id=2,
      bos_id=-1,
      minloglevel=2,
  )
  os.remove(corpus)
  return os.path.join(directory, "spiece.model")
