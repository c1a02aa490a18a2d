r"""Prints the parameter count of every model config under configs/models/.

python -m spec_decode.models.param_count
"""

from absl import app

from spec_decode import gin_config
from spec_decode.models import t5


def count_all():
  """{config file stem: number of parameters}, built abstractly (no memory)."""
  counts = {}
  for path in gin_config.model_config_files():
    gin_config.parse([path])
    counts[path.stem] = t5.num_params(t5.T5Config())
  return counts


def main(argv):
  del argv
  print(f"{'config':<16} {'parameters':>16}")
  for name, count in count_all().items():
    print(f"{name:<16} {count:>16,}")


if __name__ == "__main__":
  app.run(main)
