"""spec_decode.models.attention against references written out independently:
the softmax in t5x's order in float64, and each of a few queries attended
alone."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.models import attention


def _reference_attention(query, key, value, bias, mask):
  """t5x's order in float64: softmax over the keys, then the values."""
  query, key, value, bias = (
      np.asarray(x, np.float64) for x in (query, key, value, bias)
  )
  logits = np.einsum("bthd,bhds->bhts", query, key) + bias
  logits = np.where(mask, logits, attention.MASK_VALUE)
  weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum("bhts,bhsd->bthd", weights, value)


class DotProductAttentionTest(parameterized.TestCase):
  """Normalized after the values' product, the softmax is still t5x's."""

  def _inputs(self, dtype):
    b, t, h, d, s = 2, 3, 4, 8, 11
    keys = jax.random.split(jax.random.key(0), 4)
    query = 2 * jax.random.normal(keys[0], (b, t, h, d))
    key = jax.random.normal(keys[1], (b, h, d, s))
    value = jax.random.normal(keys[2], (b, h, s, d))
    bias = jax.random.normal(keys[3], (1, h, t, s))
    # Row 0 sees 7 keys; row 1 sees every key.
    mask = (jnp.arange(s) < jnp.array([7, s])[:, None])[:, None, None, :]
    return tuple(x.astype(dtype) for x in (query, key, value, bias)) + (mask,)

  def test_float32_matches_softmax_then_values(self):
    inputs = self._inputs(jnp.float32)
    out = attention.dot_product_attention(*inputs, dtype=jnp.float32)
    np.testing.assert_allclose(
        out, _reference_attention(*inputs), rtol=0, atol=2e-6
    )

  def test_masked_keys_have_no_weight(self):
    query, key, value, bias, mask = self._inputs(jnp.float32)
    far = jnp.where(mask[:, :, 0, :, None], value, 1e6)
    np.testing.assert_array_equal(
        attention.dot_product_attention(
            query, key, far, bias, mask, jnp.float32
        ),
        attention.dot_product_attention(
            query, key, value, bias, mask, jnp.float32
        ),
    )

  def test_bfloat16_is_no_less_accurate_than_t5x_order(self):
    # t5x casts the normalized float32 weights to bfloat16 before the values'
    # product; here the unnormalized ones are cast and each output is divided
    # in float32. Both round the weights once and the output once.
    query, key, value, bias, mask = self._inputs(jnp.bfloat16)
    exact = _reference_attention(query, key, value, bias, mask)
    logits = jnp.einsum(
        "bthd,bhds->bhts", query, key, preferred_element_type=jnp.float32
    )
    logits = jnp.where(mask, logits + bias, attention.MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
    t5x = jnp.einsum("bhts,bhsd->bthd", weights, value)
    out = attention.dot_product_attention(
        query, key, value, bias, mask, jnp.bfloat16
    )
    self.assertEqual(out.dtype, jnp.bfloat16)
    error = np.abs(np.asarray(out, np.float64) - exact).max()
    t5x_error = np.abs(np.asarray(t5x, np.float64) - exact).max()
    self.assertLessEqual(error, t5x_error)
    # Within a few bfloat16 ulps of values of magnitude about 1.
    self.assertLess(error, 2e-2)


def _dot_count(fn, *args):
  """The dot_general equations in fn's jaxpr, nested ones included."""

  def count(jaxpr):
    total = 0
    for eqn in jaxpr.eqns:
      total += eqn.primitive.name == "dot_general"
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        total += count(sub)
    return total

  return count(jax.make_jaxpr(fn)(*args).jaxpr)


class PerQueryAttentionTest(parameterized.TestCase):
  """per_query: each of a few queries attends as a call with it alone."""

  def _inputs(self, num_queries):
    b, h, d, s = 2, 4, 8, 11
    keys = jax.random.split(jax.random.key(1), 4)
    query = 2 * jax.random.normal(keys[0], (b, num_queries, h, d))
    key = jax.random.normal(keys[1], (b, h, d, s))
    value = jax.random.normal(keys[2], (b, h, s, d))
    # A bias and a causal mask that differ from query to query, and a
    # padding mask that does not (the cross-attention's [B, 1, 1, S]).
    bias = jax.random.normal(keys[3], (1, h, num_queries, s))
    causal = (jnp.arange(s) <= 6 + jnp.arange(num_queries)[:, None])[None, None]
    padding = (jnp.arange(s) < jnp.array([9, s])[:, None])[:, None, None, :]
    return query, key, value, bias, causal & padding, padding

  def test_each_query_as_if_alone(self):
    query, key, value, bias, causal, padding = self._inputs(3)
    for mask, mask_of in (
        (causal, lambda t: causal[:, :, t : t + 1]),
        (padding, lambda t: padding),
    ):
      got = attention.dot_product_attention(
          query, key, value, bias, mask, jnp.float32, per_query=True
      )
      alone = [
          attention.dot_product_attention(
              query[:, t : t + 1],
              key,
              value,
              bias[:, :, t : t + 1],
              mask_of(t),
              jnp.float32,
          )
          for t in range(3)
      ]
      np.testing.assert_array_equal(got, jnp.concatenate(alone, axis=1))
      np.testing.assert_allclose(
          got,
          _reference_attention(query, key, value, bias, mask),
          rtol=0,
          atol=2e-6,
      )

  @parameterized.parameters(
      (1, True, 2), (3, True, 6), (16, True, 32), (17, True, 2), (3, False, 2)
  )
  def test_unrolls_only_a_few_queries(self, num_queries, per_query, dots):
    # Two dots a query up to PER_QUERY_MAX_QUERIES; past it (a decoder's
    # training pass) one batched pair, as without per_query.
    query, key, value, bias, causal, _ = self._inputs(num_queries)
    attend = lambda q: attention.dot_product_attention(
        q, key, value, bias, causal, jnp.float32, per_query=per_query
    )
    self.assertEqual(_dot_count(attend, query), dots)


class KernelAttentionTest(parameterized.TestCase):
  """kernel: a few float32 queries attend in the CPU kernel
  (tests/few_queries_test.py tests the kernel itself)."""

  def _inputs(self, num_queries, dtype=jnp.float32):
    b, h, d, s = 2, 4, 8, 11
    keys = jax.random.split(jax.random.key(2), 4)
    query = jax.random.normal(keys[0], (b, num_queries, h, d))
    key = jax.random.normal(keys[1], (b, h, d, s))
    value = jax.random.normal(keys[2], (b, h, s, d))
    bias = jax.random.normal(keys[3], (1, h, num_queries, s))
    causal = (jnp.arange(s) <= 6 + jnp.arange(num_queries)[:, None])[None, None]
    return tuple(x.astype(dtype) for x in (query, key, value, bias)) + (causal,)

  @parameterized.parameters(
      (1, jnp.float32, 1),
      (16, jnp.float32, 1),
      (17, jnp.float32, 0),
      (4, jnp.bfloat16, 0),
  )
  def test_few_float32_queries_in_the_kernel(self, num_queries, dtype, calls):
    inputs = self._inputs(num_queries, dtype)
    attend = lambda *args: attention.dot_product_attention(
        *args, dtype=dtype, kernel=True
    )
    hlo = jax.jit(attend).lower(*inputs).as_text()
    self.assertEqual(
        hlo.count("custom_call @spec_decode_few_queries_attention("), calls
    )
    np.testing.assert_allclose(
        np.asarray(attend(*inputs), np.float64),
        _reference_attention(*inputs),
        rtol=0,
        atol=2e-6 if dtype == jnp.float32 else 2e-2,
    )

  def test_gradient_is_xla_attentions(self):
    # The kernel has no gradient of its own: the XLA version's, at the same
    # inputs, to float32 rounding of the outputs it weighs.
    query, key, value, bias, causal = self._inputs(3)
    weights = jax.random.normal(jax.random.key(5), query.shape)

    def loss(kernel, *args):
      out = attention.dot_product_attention(
          *args, causal, jnp.float32, kernel=kernel
      )
      return jnp.sum(out * weights)

    grads = {
        kernel: jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)), static_argnums=0)(
            kernel, query, key, value, bias
        )
        for kernel in (True, False)
    }
    for got, expected in zip(grads[True], grads[False]):
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


if __name__ == "__main__":
  absltest.main()
