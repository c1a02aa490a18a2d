"""What the absl apps share: the gin flags, quiet start-up, one-line errors."""

import contextlib
import sys

from absl import app
from absl import flags
from absl import logging

from spec_decode import checkpoints
from spec_decode import distributed
from spec_decode import gin_config
from spec_decode import report

GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "Gin files, searched for under configs/ too."
)
GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, applied after the files."
)


def start(argv):
  """Checks argv, registers seqio's vocabularies and tasks, parses gin.

  Then initializes jax.distributed if the config says so.

  Args:
    argv: the app's positional arguments (none are accepted).

  Raises:
    app.UsageError: on positional arguments.
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Keep reports readable: JAX logs backend probing, and Orbax each
    # checkpoint, at INFO.
    logging.set_verbosity(logging.WARNING)
  # Imported here, after absl has started, because TensorFlow's CUDA probe
  # logs an error when imported before it; vocabulary imports TensorFlow
  # quietly, and registers seqio's vocabularies with gin; data registers
  # the seqio tasks.
  # pylint: disable=g-import-not-at-top,unused-import
  from spec_decode import vocabulary
  from spec_decode import data
  # pylint: enable=g-import-not-at-top,unused-import

  gin_config.parse(GIN_FILES.value, GIN_BINDINGS.value)
  distributed.initialize_distributed()


_HELP_FLAGS = ("-?", "-h", "--help", "--helpshort", "--helpfull")


def _parse_flags(argv):
  """absl's flag parsing, except that asking for help exits 0, not 1, and a
  bad flag is one line, 'error: ...' (absl prints two, the first 'FATAL')."""
  asked = [arg for arg in argv[1:] if arg in _HELP_FLAGS]
  if asked:
    app.usage(
        shorthelp=asked[0] != "--helpfull", writeto_stdout=True, exitcode=0
    )
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(
        f"error: {report.one_line(e)} (--help lists the flags)", file=sys.stderr
    )
    sys.exit(1)


def run(main):
  """`app.run(main)`, with --help exiting 0 and a bad flag one line."""
  app.run(main, flags_parser=_parse_flags)


@contextlib.contextmanager
def one_line_errors():
  """Turns bad input into 'error: <one line>' on stderr and exit status 1.

  Ctrl-C becomes 'interrupted' and what the interrupted work kept, if it
  says, with the shell's status for SIGINT, 130.
  """
  try:
    yield
  except KeyboardInterrupt as e:
    print(" ".join(["interrupted", *map(str, e.args)]), file=sys.stderr)
    sys.exit(130)
  except (ValueError, RuntimeError, OSError, checkpoints.CheckpointError) as e:
    print(f"error: {report.one_line(e)}", file=sys.stderr)
    sys.exit(1)
  except Exception as e:  # pylint: disable=broad-exception-caught
    # TensorFlow's file system errors (a gs:// file unreachable offline)
    # derive from none of the above.
    if not _is_tensorflow_error(e):
      raise
    print(f"error: {report.joined(e)}", file=sys.stderr)
    sys.exit(1)


def _is_tensorflow_error(error):
  return any(
      cls.__module__.startswith("tensorflow.") for cls in type(error).__mro__
  )
