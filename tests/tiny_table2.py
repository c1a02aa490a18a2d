"""The tiny Table 2 sweep's gin file, for the tests of spec_decode.benchmark.

The demo's 1.9M-parameter draft stands in as the target, with unigram and
bigram drafts, so that a sweep compiles and decodes real Multi30k test
sentences in seconds.
"""

import pathlib
import tempfile

from absl.testing import absltest
import gin

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = ROOT / "spec_decode" / "demo"
_VOCABULARY = DEMO / "sentencepiece.model"
GAMMAS = (1, 2)
DRAFTS = ("unigram", "bigram")
NUM_EXAMPLES = 3


class TinyTable2TestCase(absltest.TestCase):
  """Writes the tiny sweep's gin file, in a directory of the class's own."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    cls.out = cls.tmp / "out"
    cls.gin_file = cls.tmp / "tiny.gin"
    cls.gin_file.write_text(f"""
include 'target:models/demo_draft.gin'
target/checkpoint_path.path = '{DEMO / "draft"}'
run.vocabulary = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{_VOCABULARY}'
seqio.SentencePieceVocabulary.extra_ids = 96
run.gamma = 1
run.max_input_len = 64
run.max_decode_len = 24
run.timing_repeats = 1
make_mesh.num_devices = 1
table2.sweep.output_dir = '{cls.out}'
table2.sweep.tasks = {{'multi30k_en_de': []}}
table2.sweep.drafts = {list(DRAFTS)}
table2.sweep.temperatures = [0.0]
table2.sweep.gammas = {list(GAMMAS)}
table2.sweep.batch_sizes = [1]
table2.sweep.num_examples = {NUM_EXAMPLES}
table2.sweep.ngram_corpus = '{DEMO / "multi30k" / "test_2016_flickr.de.gz"}'
table2.sweep.progress = False
""")

  def tearDown(self):
    gin.clear_config()
    super().tearDown()
