"""Model size files read under the target/ and draft/ scopes."""

import os
import tempfile

from absl.testing import absltest
import gin

from spec_decode import gin_config
from spec_decode.models.config import T5Config


class ScopedIncludeTest(absltest.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def _write(self, directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
      f.write(text)
    return path

  def test_two_sizes_under_two_scopes(self):
    with tempfile.TemporaryDirectory() as tmp:
      run = self._write(
          tmp,
          "run.gin",
          (
              "include 'target:models/t5_1_1_xxl.gin'\n"
              "include 'draft:models/t5_1_1_small.gin'\n"
              "target/T5Config.dtype = 'bfloat16'\n"
          ),
      )
      gin_config.parse([run])
    with gin.config_scope("target"):
      target = T5Config()
    with gin.config_scope("draft"):
      draft = T5Config()
    self.assertEqual(
        (target.emb_dim, target.num_heads, target.dtype), (4096, 64, "bfloat16")
    )
    self.assertEqual(
        (draft.emb_dim, draft.num_heads, draft.dtype), (512, 6, "float32")
    )
    # Nothing leaks into the unscoped T5Config.
    with self.assertRaisesRegex(RuntimeError, "vocab_size"):
      T5Config()

  def test_nested_includes_keep_the_scope(self):
    with tempfile.TemporaryDirectory() as tmp:
      self._write(tmp, "inner.gin", "T5Config.vocab_size = 7\n")
      self._write(
          tmp, "outer.gin", f"include '{tmp}/inner.gin'\nT5Config.emb_dim = 3\n"
      )
      run = self._write(tmp, "run.gin", f"include 'draft:{tmp}/outer.gin'\n")
      gin_config.parse([run])
    with gin.config_scope("draft"):
      config = T5Config()
    self.assertEqual((config.vocab_size, config.emb_dim), (7, 3))

  def test_scope_bindings_text(self):
    text = (
        "# comment\nT5Config.emb_dim = 8\nfoo/T5Config.dtype = 'x'\n"
        "include 'models/a.gin'\n"
    )
    self.assertEqual(
        gin_config.scope_bindings(text, "draft"),
        "# comment\ndraft/T5Config.emb_dim = 8\n"
        "draft/foo/T5Config.dtype = 'x'\ninclude 'draft:models/a.gin'\n",
    )


class SyntaxErrorTest(absltest.TestCase):

  def test_a_binding_that_does_not_parse_names_the_flag_and_its_line(self):
    with self.assertRaises(gin_config.GinSyntaxError) as caught:
      gin_config.parse([], ["T5Config.emb_dim = 8", "T5Config.num_heads ="])
    where = "--gin_bindings, line 2: Unable to parse value: "
    # gin gives no text for a value missing at the end of its line; the
    # caret is under the '='.
    self.assertEqual(
        str(caught.exception),
        f"{where}T5Config.num_heads =\n"
        + " " * (len("error: ") + len(where) + len("T5Config.num_heads "))
        + "^",
    )

  def test_an_unclosed_bracket_is_one_line(self):
    # Python's tokenizer raises under gin's parser: no SyntaxError.
    with self.assertRaisesRegex(
        ValueError,
        r"^--gin_bindings: EOF in multi-line statement: an unclosed bracket "
        r"or string$",
    ):
      gin_config.parse([], ["T5Config.emb_dim = 8", "T5Config.num_heads = ("])
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "run.gin")
      with open(path, "w") as f:
        f.write("T5Config.emb_dim = [8,\n")
      with self.assertRaisesRegex(
          ValueError,
          f"^{path} \\(or a file it includes\\): EOF in multi-line "
          "statement: an unclosed bracket or string$",
      ):
        gin_config.parse([path])


if __name__ == "__main__":
  absltest.main()
