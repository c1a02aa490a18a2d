"""Every run config under configs/ parses and builds both models abstractly."""

import os

from absl.testing import absltest
from absl.testing import parameterized
import gin
import jax

from spec_decode import compare  # pylint: disable=unused-import  (gin)
from spec_decode import gin_config
from spec_decode import pair
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)
from spec_decode.models import t5

_PAPER = {
    # run file: (draft parameters, gamma)
    "t5_1_1_xxl_small_ende.gin": (76_961_152, 7),
    "t5_1_1_xxl_base_ende.gin": (247_577_856, 7),
    "t5_1_1_xxl_large_ende.gin": (783_150_080, 7),
    "t5_1_1_xxl_small_cnndm.gin": (76_961_152, 5),
}
_XXL = 11_135_332_352
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_files():
  return sorted(p.name for p in gin_config.CONFIG_DIR.glob("*.gin"))


class ConfigsTest(parameterized.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_paper_configs_are_all_here(self):
    self.assertContainsSubset(set(_PAPER) | {"demo.gin"}, set(_run_files()))

  @parameterized.parameters(*_run_files())
  def test_parses_and_builds(self, name):
    gin_config.parse([name], ["run.output_dir = '/tmp/unused'"])
    target = pair.model_config("target")
    target_params = t5.num_params(target)
    self.assertGreater(gin.query_parameter("run.gamma"), 0)
    gin.query_parameter("run.vocabulary")
    if name in _PAPER:
      draft_count, gamma = _PAPER[name]
      self.assertEqual(target_params, _XXL)
      self.assertEqual(target.dtype, "bfloat16")
      self.assertEqual(t5.num_params(pair.model_config("draft")), draft_count)
      self.assertEqual(gin.query_parameter("run.gamma"), gamma)
      self.assertEqual(gin.query_parameter("run.batch_size"), 1)
      self.assertStartsWith(
          gin.query_parameter("target/checkpoint_path.path"), "gs://t5-data/"
      )

  @parameterized.parameters(
      ("demo.gin",),
      ("demo_9m.gin",),
      ("demo_distilled.gin",),
      ("demo_shared.gin",),
      ("demo_t5_draft.gin",),
      ("demo_sampling.gin",),
      (
          "demo_shared.gin",
          "draft/checkpoint_path.path = "
          "'spec_decode/demo/draft_shared_greedy_48m'",
      ),
  )
  def test_embedded_checkpoints_fit_their_configs(self, name, *bindings):
    os.chdir(_REPO)  # The demo's checkpoint paths are relative to it.
    gin_config.parse([name], ["run.output_dir = '/tmp/unused'", *bindings])
    for scope in ("target", "draft"):
      loaded = pair.load_model(scope)
      self.assertEqual(
          sum(x.size for x in jax.tree.leaves(loaded.params)),
          t5.num_params(loaded.config),
      )


if __name__ == "__main__":
  absltest.main()
