"""Gin plumbing: where the configs live, and model files read under a scope.

A run holds two models, so their size files cannot both bind `T5Config`
unscoped: the second would overwrite the first. A run file therefore includes
each size file under a gin scope,

  include 'target:models/t5_1_1_xxl.gin'
  include 'draft:models/t5_1_1_small.gin'

and the file is read with every binding (and nested include) moved into that
scope: `T5Config.emb_dim = 4096` becomes `target/T5Config.emb_dim = 4096`.
The model is then built with `gin.config_scope('target')`. Size files hold
plain bindings and includes (no macros), as t5x's do.
"""

import io
import logging
import os
import pathlib
import re
import tokenize

import gin

# The configs: files include each other relative to this directory
# ('models/t5_1_1_small.gin'), as t5x's gin files do. An installed wheel
# carries a copy in the package (setup.py puts it there); a checkout or an
# editable install reads configs/ at the repository's root.
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
CONFIG_DIR = (
    _PACKAGE_DIR / "configs"
    if (_PACKAGE_DIR / "configs").is_dir()
    else _PACKAGE_DIR.parent / "configs"
)

# '<search dir>/<scope>:<path>', as gin joins a search path and an include.
_SCOPED_PATH = re.compile(r"^(?P<dir>.*?)(?P<scope>[A-Za-z_]\w*):(?P<path>.+)$")
# A binding at the start of a line: '[scopes/]Configurable.param ='.
_BINDING = re.compile(r"^(?=[A-Za-z_][\w./]*\.\w+\s*=)", re.MULTILINE)
_INCLUDE = re.compile(r"^include\s+(['\"])(?P<path>[^'\"]+)\1", re.MULTILINE)


def _split_scoped(path):
  match = _SCOPED_PATH.match(str(path))
  if not match or os.path.isfile(path):
    return None
  return match["scope"], os.path.join(match["dir"], match["path"])


def scope_bindings(text, scope):
  """Moves every binding and include of a gin file's text into `scope`."""
  text = _BINDING.sub(f"{scope}/", text)
  return _INCLUDE.sub(
      lambda m: f"include {m[1]}{scope}:{m['path']}{m[1]}", text
  )


def _is_scoped_file(path):
  split = _split_scoped(path)
  return split is not None and os.path.isfile(split[1])


def _read_scoped_file(path):
  scope, real_path = _split_scoped(path)
  return io.StringIO(scope_bindings(pathlib.Path(real_path).read_text(), scope))


gin.config.register_file_reader(_read_scoped_file, _is_scoped_file)


def _drop_gin_path_probes(record):
  # gin probes every search path with its Python-package reader, which logs
  # an error for each miss before the next path finds the file.
  return record.module != "resource_reader"


logging.getLogger().addFilter(_drop_gin_path_probes)


class GinSyntaxError(ValueError):
  """A gin file or binding that does not parse; two lines, with a caret."""

  # report.one_line shows every line of the message.
  multiline = True


# What gin joins the bindings into, one a line, and parses with no file name.
_BINDINGS = "--gin_bindings"


def _source_line(error, bindings):
  """The line a SyntaxError is on; gin leaves it empty at a line's end."""
  if error.text:
    return error.text.rstrip("\n")
  try:
    text = (
        "\n".join(bindings)
        if error.filename is None
        else pathlib.Path(error.filename).read_text()
    )
  except OSError:
    return ""
  lines = text.splitlines()
  return (
      lines[error.lineno - 1] if 0 < (error.lineno or 0) <= len(lines) else ""
  )


def _syntax_error(error, bindings):
  """A SyntaxError of gin's parser as where it is, the line and a caret."""
  source = error.filename or _BINDINGS
  where = f"{source}, line {error.lineno}: {error.msg.rstrip('.')}: "
  caret = " " * (len("error: ") + len(where) + max((error.offset or 1) - 1, 0))
  return GinSyntaxError(f"{where}{_source_line(error, bindings)}\n{caret}^")


def _check_files_exist(files):
  for file in files:
    if not (
        os.path.isfile(file)
        or os.path.isfile(CONFIG_DIR / file)
        or _is_scoped_file(file)
    ):
      raise ValueError(
          f"gin file {file} not found (looked in the working directory and "
          f"in {CONFIG_DIR})"
      )


def _parse_text(parse_fn, source, bindings):
  """Calls parse_fn(), which parses `source`, with gin's errors as ours."""
  try:
    parse_fn()
  except SyntaxError as e:
    raise _syntax_error(e, bindings) from None
  except tokenize.TokenError as e:
    # Python's tokenizer, under gin's parser, reached the end of the text
    # inside a bracket or a triple-quoted string.
    if source != _BINDINGS:
      source = f"{source} (or a file it includes)"
    raise ValueError(
        f"{source}: {e.args[0]}: an unclosed bracket or string"
    ) from None


def parse(files=(), bindings=(), *, skip_unknown=False, finalize=True):
  """Clears gin, then parses `files` (paths, or relative to configs/).

  Args:
    files: gin files.
    bindings: gin bindings, applied after the files.
    skip_unknown: ignore bindings of configurables not imported (a tool that
      reads a run's files without running it).
    finalize: lock the config.

  Raises:
    ValueError: if a file does not exist, or ends inside a bracket.
    GinSyntaxError: if a file or binding does not parse.
  """
  gin.clear_config()
  gin.add_config_file_search_path(str(CONFIG_DIR))
  _check_files_exist(files)
  bindings = list(bindings)
  for file in files:
    _parse_text(
        lambda f=file: gin.parse_config_file(f, skip_unknown), file, bindings
    )
  _parse_text(
      lambda: gin.parse_config(bindings, skip_unknown), _BINDINGS, bindings
  )
  if finalize:
    gin.finalize()


def model_config_files():
  """Every model size file under configs/models/, sorted by name."""
  return sorted((CONFIG_DIR / "models").glob("*.gin"))
