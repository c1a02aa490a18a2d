"""hlo_traffic: off-chip bytes counted from compiled HLO text.

The TPU modules here are written by hand in the form a TPU compile prints
(operands by name, on-chip buffers marked S(1) in their layouts), from the
compile of a [8, 4096] x [4096, 4096] bfloat16 dot, shrunk; the CPU ones are
compiled here, and every expected count is worked out by hand.
"""

from absl.testing import absltest
import jax
from jax import lax
import jax.numpy as jnp

from spec_decode import hlo_traffic

# A dot whose weights the compiler prefetches into VMEM: x [8, 128] and
# w [128, 256] in bfloat16, the result [8, 256].
_PREFETCHED_DOT = """\
HloModule jit_dot, entry_computation_layout={(bf16[8,128]{1,0}, bf16[128,256]{1,0})->bf16[8,256]{1,0}}

%fused_computation (param_0: bf16[8,128], param_1.1: bf16[128,256]) -> bf16[8,256] {
  %param_0 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1.1 = bf16[128,256]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  %convolution.1 = f32[8,256]{1,0:T(8,128)} convolution(%param_0, %param_1.1), dim_labels=bf_io->bf
  ROOT %convert.1 = bf16[8,256]{1,0:T(8,128)(2,1)} convert(%convolution.1)
}

ENTRY %main.1 (x.1: bf16[8,128], w.1: bf16[128,256]) -> bf16[8,256] {
  %w.1 = bf16[128,256]{1,0:T(8,128)(2,1)} parameter(1), metadata={op_name="w"}
  %copy-start = (bf16[128,256]{1,0:T(8,128)(2,1)S(1)}, bf16[128,256]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w.1), cross_program_prefetch_index=0
  %x.1 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="x"}
  %copy-done = bf16[128,256]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  ROOT %convolution_convert_fusion = bf16[8,256]{1,0:T(8,128)(2,1)} fusion(%x.1, %copy-done), kind=kOutput, calls=%fused_computation
}
"""

# An embedding row looked up inside a fusion, and a cache row written in
# place by a scatter fusion: table [1000, 64] and cache [4, 32, 64] in f32.
_SLICED_AND_UPDATED = """\
%lookup (param_0.2: f32[1000,64], param_1.2: s32[]) -> f32[1,64] {
  %param_0.2 = f32[1000,64]{1,0} parameter(0)
  %param_1.2 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dynamic-slice.1 = f32[1,64]{1,0} dynamic-slice(%param_0.2, %param_1.2, %zero), dynamic_slice_sizes={1,64}
}

%write (param_0.3: f32[4,32,64], param_1.3: s32[4,1], param_2.3: f32[4,64]) -> f32[4,32,64] {
  %param_0.3 = f32[4,32,64]{2,1,0} parameter(0)
  %param_1.3 = s32[4,1]{1,0} parameter(1)
  %param_2.3 = f32[4,64]{1,0} parameter(2)
  ROOT %scatter.1 = f32[4,32,64]{2,1,0} scatter(%param_0.3, %param_1.3, %param_2.3), update_window_dims={1}, to_apply=%add
}

ENTRY %main.2 (table: f32[1000,64], i: s32[], cache: f32[4,32,64], at: s32[4,1], new: f32[4,64]) -> (f32[1,64], f32[4,32,64]) {
  %table = f32[1000,64]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %cache = f32[4,32,64]{2,1,0} parameter(2)
  %at = s32[4,1]{1,0} parameter(3)
  %new = f32[4,64]{1,0} parameter(4)
  %row = f32[1,64]{1,0} fusion(%table, %i), kind=kLoop, calls=%lookup
  %written = f32[4,32,64]{2,1,0} fusion(%cache, %at, %new), kind=kLoop, calls=%write
  %prefix = f32[4,16,64]{2,1,0} slice(%written), slice={[0:4], [0:16], [0:64]}
  ROOT %out = (f32[1,64], f32[4,32,64]) tuple(%row, %written)
}
"""


class ArrayBytesTest(absltest.TestCase):

  def test_counts_each_array_of_a_tuple(self):
    self.assertEqual(
        hlo_traffic.array_bytes("(f32[8]{0}, bf16[2,3]{1,0}, pred[5], u32[])"),
        8 * 4 + 6 * 2 + 5 + 4,
    )

  def test_skips_on_chip_arrays_unless_asked(self):
    hlo_type = "(bf16[4,4]{1,0:T(8,128)(2,1)S(1)}, bf16[4,4]{1,0:T(8,128)})"
    self.assertEqual(hlo_traffic.array_bytes(hlo_type), 32)
    self.assertEqual(hlo_traffic.array_bytes(hlo_type, offchip_only=False), 64)


class TpuModuleTest(absltest.TestCase):

  def test_a_prefetched_weight_counts_once(self):
    x, w, out = 8 * 128 * 2, 128 * 256 * 2, 8 * 256 * 2
    self.assertEqual(
        sorted(hlo_traffic.instruction_bytes(_PREFETCHED_DOT)),
        sorted(
            [
                (w, "copy-start", "copy-start"),
                (x + out, "fusion", "convolution_convert_fusion"),
            ]
        ),
    )
    self.assertEqual(hlo_traffic.offchip_bytes(_PREFETCHED_DOT), x + w + out)

  def test_without_the_prefetch_the_fusion_reads_the_weight(self):
    resident = _PREFETCHED_DOT.replace(
        "%copy-start = (bf16[128,256]{1,0:T(8,128)(2,1)S(1)}",
        "%copy-start = (bf16[128,256]{1,0:T(8,128)(2,1)}",
    ).replace(
        "%copy-done = bf16[128,256]{1,0:T(8,128)(2,1)S(1)}",
        "%copy-done = bf16[128,256]{1,0:T(8,128)(2,1)}",
    )
    x, w, out = 8 * 128 * 2, 128 * 256 * 2, 8 * 256 * 2
    self.assertEqual(hlo_traffic.offchip_bytes(resident), x + 2 * w + out)

  def test_slices_and_in_place_updates_count_what_they_touch(self):
    row, index = 64 * 4, 4
    scatter = 4 * 4 + 4 * 64 * 4  # indices and updates read, updates written
    prefix = 4 * 16 * 64 * 4  # read and written
    self.assertEqual(
        sorted(hlo_traffic.instruction_bytes(_SLICED_AND_UPDATED)),
        sorted(
            [
                (row + index + row, "fusion", "row"),
                (scatter + 4 * 64 * 4, "fusion", "written"),
                (2 * prefix, "slice", "prefix"),
            ]
        ),
    )


class CpuCompileTest(absltest.TestCase):

  def _text(self, fn, *shapes, donate=()):
    return jax.jit(fn, donate_argnums=donate).lower(*shapes).compile().as_text()

  def test_a_matmul_reads_its_operands_and_writes_its_result(self):
    x = jax.ShapeDtypeStruct((4, 64), jnp.float32)
    w = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    text = self._text(lambda x, w: x @ w, x, w)
    self.assertEqual(
        hlo_traffic.offchip_bytes(text), 4 * (4 * 64 + 64 * 128 + 4 * 128)
    )

  def test_a_donated_row_write_touches_the_row(self):
    cache = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    update = jax.ShapeDtypeStruct((1, 256), jnp.float32)
    index = jax.ShapeDtypeStruct((), jnp.int32)
    text = self._text(
        lambda c, u, i: lax.dynamic_update_slice(c, u, (i, 0)),
        cache,
        update,
        index,
        donate=(0,),
    )
    self.assertEqual(hlo_traffic.offchip_bytes(text), 1024 + 4 + 1024)

  def test_a_looked_up_row_reads_the_row(self):
    table = jax.ShapeDtypeStruct((1000, 256), jnp.float32)
    index = jax.ShapeDtypeStruct((), jnp.int32)
    text = self._text(
        lambda t, i: lax.dynamic_index_in_dim(t, i, keepdims=False) * 2,
        table,
        index,
    )
    self.assertEqual(hlo_traffic.offchip_bytes(text), 1024 + 4 + 1024)


if __name__ == "__main__":
  absltest.main()
