"""spec_decode/kernels/library: building and caching the CPU kernels."""

import os
import pathlib
import subprocess
import tempfile
from unittest import mock

from absl.testing import absltest

from spec_decode.kernels import few_queries
from spec_decode.kernels import few_rows
from spec_decode.kernels import library


class BuildTest(absltest.TestCase):

  def test_a_second_build_reuses_the_library(self):
    built = library.build(few_rows._SOURCE, few_rows._HEADERS)
    with mock.patch.object(subprocess, "run") as run:
      self.assertEqual(
          library.build(few_rows._SOURCE, few_rows._HEADERS), built
      )
    run.assert_not_called()

  def test_each_kernel_its_own_library(self):
    self.assertNotEqual(
        library.build(few_rows._SOURCE, few_rows._HEADERS),
        library.build(few_queries._SOURCE, (), few_queries._FLAGS),
    )

  def test_a_header_change_rebuilds(self):
    scratch = pathlib.Path(self.enterContext(tempfile.TemporaryDirectory()))
    source, header = scratch / "k.cc", scratch / "k.h"
    source.write_text('#include "k.h"\nint f() { return K; }\n')
    header.write_text("#define K 1\n")
    with mock.patch.dict(os.environ, {"SPEC_DECODE_CACHE": str(scratch)}):
      first = library.build(source, (header,))
      header.write_text("#define K 2\n")
      second = library.build(source, (header,))
    self.assertNotEqual(first, second)
    self.assertTrue(first.exists() and second.exists())

  def test_a_compiler_failure_names_the_compiler_and_source(self):
    cache = self.enterContext(tempfile.TemporaryDirectory())
    with mock.patch.dict(
        os.environ, {"CXX": "false", "SPEC_DECODE_CACHE": cache}
    ):
      with self.assertRaisesRegex(RuntimeError, "false failed on few_rows.cc"):
        library.build(few_rows._SOURCE, few_rows._HEADERS)
    self.assertEqual(list(pathlib.Path(cache, "kernels").iterdir()), [])


if __name__ == "__main__":
  absltest.main()
