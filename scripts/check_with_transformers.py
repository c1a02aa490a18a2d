r"""Checks a run's greedy outputs against transformers' own `generate`.

  python scripts/check_with_transformers.py \
      --checkpoint=~/models/flan-t5-large \
      --outputs=results/flan/outputs.jsonl --max_decode_len=64

For each row of a greedy run's outputs.jsonl, transformers' model of the
target checkpoint (a Hugging Face directory) generates from the row's input
(greedy, one row at a time, at most `max_decode_len` new tokens, float32),
and its text, decoded by the checkpoint's tokenizer, is compared with the
baseline's and the speculative decoder's. Prints each row that differs and
'N of M rows identical'; the exit status is 1 if any row differs. Needs
torch and transformers (the test extras).
"""

import json
import os
import sys

from absl import app
from absl import flags
import torch
import transformers

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "The target's Hugging Face checkpoint directory."
)
_OUTPUTS = flags.DEFINE_string(
    "outputs", None, "The run's outputs.jsonl (run.output_dir/outputs.jsonl)."
)
_MAX_DECODE_LEN = flags.DEFINE_integer(
    "max_decode_len", 64, "The run's run.max_decode_len."
)
flags.mark_flags_as_required(["checkpoint", "outputs"])


def generate(model, tokenizer, text, max_decode_len):
  """transformers' greedy output for `text`, decoded."""
  input_ids = torch.tensor([tokenizer(text).input_ids])
  with torch.no_grad():
    output = model.generate(
        input_ids,
        max_new_tokens=max_decode_len,
        do_sample=False,
        num_beams=1,
        decoder_start_token_id=0,  # T5's; spec_decode refuses others.
    )
  return tokenizer.decode(output[0], skip_special_tokens=True)


def main(argv):
  del argv
  checkpoint = os.path.expandvars(os.path.expanduser(_CHECKPOINT.value))
  tokenizer = transformers.T5Tokenizer.from_pretrained(checkpoint)
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
      checkpoint, dtype=torch.float32
  ).eval()
  with open(os.path.expanduser(_OUTPUTS.value)) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  identical = 0
  for index, row in enumerate(rows):
    expected = generate(model, tokenizer, row["input"], _MAX_DECODE_LEN.value)
    if row["baseline"] == expected == row["speculative"]:
      identical += 1
      continue
    print(f"row {index}: {row['input']}")
    print(f"  transformers: {expected}")
    print(f"  baseline:     {row['baseline']}")
    print(f"  speculative:  {row['speculative']}")
  print(f"{identical} of {len(rows)} rows identical to transformers' generate")
  sys.exit(0 if identical == len(rows) else 1)


if __name__ == "__main__":
  app.run(main)
