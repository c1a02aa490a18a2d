"""What the target did with each drafted token, from a speculative run's trace.

`speculative.speculative_decode` records where each emitted token came from
(`SpeculativeResult.token_sources`: ACCEPTED, REPLACEMENT or BONUS) and, at
each replacement, the drafted token it replaced (`rejected_tokens`). Each
target call emits a run of accepted drafts closed by one replacement or bonus
token, so the trace splits into blocks, one per target call. From them:

- `row_blocks`, `result_blocks`: each block's accepted drafts, the rejected
  draft if any, and the token the target added; `block_table` lays one row's
  blocks out as a grid for a picture.
- `rates_by_position`: the acceptance rate of the i-th drafted token of a
  block. A draft is judged only when the drafts before it were accepted, so
  under the paper's assumption of i.i.d. acceptances (section 3.1) every
  position is accepted at rate alpha, and position i is judged in a fraction
  alpha^(i-1) of the blocks.
- `token_counts`, `rates_by_frequency`: the acceptance rate of drafted tokens
  grouped by how often they occur in a corpus.
- `alpha_comparison`: the empirical rate (accepted / judged) next to the
  paper's estimator, the mean over judged positions of
  beta = sum_x min(p(x), q(x)) (Corollary 3.6).

Drafted tokens count as judged as in `SpeculativeResult`: the accepted ones
and the first rejected one of each block, up to EOS and max_decode_len.
"""

import dataclasses
from typing import Iterable, NamedTuple, Optional, Sequence

import numpy as np

from spec_decode import speculative

# `block_table`'s code for a rejected drafted token (the trace's own codes are
# speculative.PADDING, ACCEPTED, REPLACEMENT and BONUS).
REJECTED = 4


class Block(NamedTuple):
  """One target call's share of a row.

  Attributes:
    accepted: the drafted tokens the target accepted, in order.
    rejected: the first drafted token the target rejected; None when every
      draft was accepted or the block was cut.
    next_token: the token the target added: drawn from the residual
      max(0, p - q) in place of `rejected`, or the bonus token drawn from p
      after a full accept; None when EOS or max_decode_len cut the block
      before it.
    next_source: speculative.REPLACEMENT or BONUS; speculative.PADDING when
      the block was cut.
  """

  accepted: tuple[int, ...]
  rejected: Optional[int]
  next_token: Optional[int]
  next_source: int

  @property
  def judged(self) -> tuple[int, ...]:
    """The drafted tokens the target ruled on: accepted, then rejected."""
    rejected = () if self.rejected is None else (self.rejected,)
    return self.accepted + rejected


def row_blocks(
    sequence: Sequence[int],
    token_sources: Sequence[int],
    rejected_tokens: Sequence[int],
) -> list[Block]:
  """Splits one row's trace into its blocks, one per target call.

  Args:
    sequence: int [max_decode_len] the row's emitted tokens.
    token_sources: int [max_decode_len] their sources (ACCEPTED, REPLACEMENT,
      BONUS, then PADDING after the row's length).
    rejected_tokens: int [max_decode_len] the rejected draft at each
      REPLACEMENT, -1 elsewhere.

  Returns:
    The row's blocks in order; only the last may be cut.

  Raises:
    ValueError: on a code that is not a source, or a token after PADDING.
  """
  sources = np.asarray(token_sources)
  length = int(np.sum(sources != speculative.PADDING))
  if np.any(sources[length:] != speculative.PADDING):
    raise ValueError("token_sources has tokens after PADDING.")
  blocks, accepted = [], []
  for token, source, rejected in zip(
      np.asarray(sequence)[:length].tolist(),
      sources[:length].tolist(),
      np.asarray(rejected_tokens)[:length].tolist(),
  ):
    if source == speculative.ACCEPTED:
      accepted.append(token)
    elif source in (speculative.REPLACEMENT, speculative.BONUS):
      is_replacement = source == speculative.REPLACEMENT
      blocks.append(
          Block(
              tuple(accepted),
              rejected if is_replacement else None,
              token,
              source,
          )
      )
      accepted = []
    else:
      raise ValueError(f"Unknown token source {source}.")
  if accepted:
    blocks.append(Block(tuple(accepted), None, None, speculative.PADDING))
  return blocks


def result_blocks(result: speculative.SpeculativeResult) -> list[list[Block]]:
  """`row_blocks` for every row of a result: [B] lists of blocks."""
  return [
      row_blocks(*row)
      for row in zip(
          np.asarray(result.sequences),
          np.asarray(result.token_sources),
          np.asarray(result.rejected_tokens),
      )
  ]


def _check_gamma(blocks: Sequence[Block], gamma: int) -> None:
  if max((len(block.judged) for block in blocks), default=0) > gamma:
    raise ValueError(f"A block judges more than gamma={gamma} drafted tokens.")


def block_table(
    blocks: Sequence[Block], gamma: int
) -> tuple[np.ndarray, np.ndarray]:
  """One row's blocks as a grid: a line per target call.

  Columns 0..gamma-1 hold the judged drafted tokens at their positions in the
  block, column gamma the token the target added. The output reads, line by
  line, as the ACCEPTED cells then the target's cell.

  Args:
    blocks: one row's blocks.
    gamma: tokens drafted per target call.

  Returns:
    tokens: int32 [len(blocks), gamma + 1], -1 in empty cells.
    kinds: int32 [len(blocks), gamma + 1], speculative.ACCEPTED, REJECTED,
      REPLACEMENT or BONUS; speculative.PADDING in empty cells (drafts after
      a rejection, which the target did not judge, and a cut block's last
      column).
  """
  _check_gamma(blocks, gamma)
  tokens = np.full((len(blocks), gamma + 1), -1, np.int32)
  kinds = np.full((len(blocks), gamma + 1), speculative.PADDING, np.int32)
  for line, block in enumerate(blocks):
    tokens[line, : len(block.judged)] = block.judged
    kinds[line, : len(block.accepted)] = speculative.ACCEPTED
    if block.rejected is not None:
      kinds[line, len(block.accepted)] = REJECTED
    if block.next_token is not None:
      tokens[line, gamma] = block.next_token
      kinds[line, gamma] = block.next_source
  return tokens, kinds


@dataclasses.dataclass(frozen=True)
class Rates:
  """Accepted and judged drafted tokens in K groups.

  Attributes:
    accepted: int64 [K] drafted tokens accepted.
    judged: int64 [K] drafted tokens judged.
  """

  accepted: np.ndarray
  judged: np.ndarray

  @property
  def rate(self) -> np.ndarray:
    """float64 [K] accepted / judged; NaN where nothing was judged."""
    with np.errstate(invalid="ignore"):
      return self.accepted / self.judged


def rates_by_position(blocks: Iterable[Block], gamma: int) -> Rates:
  """Acceptance by position in the block: group i is the (i+1)-th draft.

  Args:
    blocks: blocks of any rows decoded with `gamma`.
    gamma: tokens drafted per target call.

  Returns:
    `Rates` with K = gamma.
  """
  blocks = list(blocks)
  _check_gamma(blocks, gamma)
  accepted = np.zeros((gamma,), np.int64)
  judged = np.zeros((gamma,), np.int64)
  for block in blocks:
    accepted[: len(block.accepted)] += 1
    judged[: len(block.judged)] += 1
  return Rates(accepted, judged)


def token_counts(
    sequences: Iterable[Sequence[int]], vocab_size: int
) -> np.ndarray:
  """How often each token id occurs in a corpus of token sequences.

  Args:
    sequences: token sequences (e.g. German references through the
      vocabulary, with EOS appended to count it too).
    vocab_size: V.

  Returns:
    int64 [V] counts.

  Raises:
    ValueError: on an id outside [0, V).
  """
  tokens = np.concatenate(
      [np.asarray(sequence, np.int64).reshape(-1) for sequence in sequences]
      + [np.zeros((0,), np.int64)]
  )
  if np.any((tokens < 0) | (tokens >= vocab_size)):
    raise ValueError(f"A sequence holds token ids outside [0, {vocab_size}).")
  return np.bincount(tokens, minlength=vocab_size)


def rates_by_frequency(
    blocks: Iterable[Block], counts: np.ndarray, edges: Sequence[float]
) -> Rates:
  """Acceptance of drafted tokens grouped by their count in a corpus.

  Args:
    blocks: blocks of any rows.
    counts: int [V] each token's count (see `token_counts`).
    edges: K + 1 increasing bounds: group k holds the drafted tokens x with
      edges[k] <= counts[x] < edges[k + 1] (np.inf as the last bound keeps
      every token).

  Returns:
    `Rates` with K = len(edges) - 1.

  Raises:
    ValueError: on edges that do not increase, or a drafted token whose count
      lies outside them.
  """
  edges = np.asarray(edges, np.float64)
  if edges.ndim != 1 or len(edges) < 2 or np.any(np.diff(edges) <= 0):
    raise ValueError(f"edges must be at least 2 increasing bounds: {edges}.")
  tokens, is_accepted = [], []
  for block in blocks:
    tokens.extend(block.judged)
    is_accepted.extend([True] * len(block.accepted))
    is_accepted.extend([False] * (len(block.judged) - len(block.accepted)))
  groups = np.searchsorted(edges, counts[np.asarray(tokens, np.int64)], "right")
  groups -= 1
  if np.any((groups < 0) | (groups >= len(edges) - 1)):
    raise ValueError("A drafted token's count lies outside the edges.")
  num_groups = len(edges) - 1
  return Rates(
      accepted=np.bincount(
          groups[np.asarray(is_accepted, bool)], minlength=num_groups
      ),
      judged=np.bincount(groups, minlength=num_groups),
  )


@dataclasses.dataclass(frozen=True)
class AlphaComparison:
  """The empirical acceptance rate and the paper's estimator of alpha.

  Each judged draft is accepted with probability beta given everything
  before it, so accepted - beta_sum is a sum of zero-mean terms of variance
  beta (1 - beta): empirical - estimate is noise of standard deviation at
  most `std_bound`. In greedy decoding beta is 1 where the draft's argmax is
  the target's and 0 elsewhere, so the two are equal.

  Attributes:
    accepted: drafted tokens accepted.
    judged: drafted tokens judged.
    beta_sum: sum of beta = sum_x min(p(x), q(x)) over the judged positions.
  """

  accepted: int
  judged: int
  beta_sum: float

  @property
  def empirical(self) -> float:
    """accepted / judged."""
    return self.accepted / self.judged

  @property
  def estimate(self) -> float:
    """The mean of beta over the judged positions (Corollary 3.6)."""
    return self.beta_sum / self.judged

  @property
  def std_bound(self) -> float:
    """A bound on the standard deviation of empirical - estimate.

    sqrt(beta_sum - beta_sum^2 / judged) / judged: the variance of
    accepted - beta_sum, sum beta (1 - beta), is at most
    beta_sum - beta_sum^2 / judged, since sum beta^2 >= beta_sum^2 / judged.
    """
    variance = self.beta_sum - self.beta_sum**2 / self.judged
    return float(np.sqrt(max(variance, 0.0))) / self.judged


def alpha_comparison(
    results: Iterable[speculative.SpeculativeResult],
) -> AlphaComparison:
  """Sums the counts of every row of `results` (e.g. one per batch)."""
  accepted = judged = 0
  beta_sum = 0.0
  for result in results:
    accepted += int(np.sum(result.accepted_tokens))
    judged += int(np.sum(result.drafted_tokens))
    beta_sum += float(np.sum(result.beta_sum, dtype=np.float64))
  return AlphaComparison(accepted, judged, beta_sum)
