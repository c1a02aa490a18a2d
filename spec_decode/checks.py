"""What a setting's value must be, for the one-line errors of bad input.

gin passes a binding's value as written, so `run.temperature = 'hot'` or
`read_inputs.num_examples = True` arrive as a str and a bool. A bool is an
int to Python, but never a count, a seed, a temperature or a threshold.
"""

import numbers

import numpy as np


def is_number(value):
  """A real number (numpy's scalars too), bool aside."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value):
  """A Python int, bool aside."""
  return isinstance(value, int) and not isinstance(value, bool)


def check_count(value, name):
  """Raises the one-line ValueError unless `value` is an int >= 1.

  Args:
    value: the setting's value.
    name: the setting, as the user writes it (run.batch_size).
  """
  if not (is_int(value) and value >= 1):
    raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def is_integer(value):
  """A Python int or a numpy integer, bool aside."""
  return is_int(value) or isinstance(value, np.integer)
