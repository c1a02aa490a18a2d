"""Gin plumbing: where the configs live and how files and bindings are read."""

import pathlib

import gin

# configs/ at the repository's root; files include each other relative to it
# ('models/t5_vocab.gin'), as t5x's gin files do.
CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


def parse(files=(), bindings=()):
  """Clears gin, then parses `files` (paths, or relative to configs/)."""
  gin.clear_config()
  gin.add_config_file_search_path(str(CONFIG_DIR))
  gin.parse_config_files_and_bindings(list(files), list(bindings))


def model_config_files():
  """Every model size file under configs/models/, sorted by name."""
  return sorted((CONFIG_DIR / "models").glob("*.gin"))
