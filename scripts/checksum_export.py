r"""Writes checksums.json into Orbax parameter exports that predate it.

  python scripts/checksum_export.py spec_decode/demo/target [DIR ...]

Exports written by `spec_decode.train` (`train.export_dir`) have it already;
this records the arrays of an older export as they are now, so run it only on
files known to be good (the shipped demo models were checked by their BLEU and
demo report before).
"""

import sys

from spec_decode.checkpoints import checksums
from spec_decode.checkpoints import orbax_pytree


def main(directories):
  for directory in directories:
    leaves = orbax_pytree.list_arrays(directory)
    checksums.write(
        orbax_pytree.pytree_directory(directory),
        {name: leaf.read(None) for name, leaf in leaves.items()},
    )
    print(f"{directory}: {len(leaves)} arrays")


if __name__ == "__main__":
  main(sys.argv[1:])
