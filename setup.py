"""spec_decode: lossless speculative decoding for T5 in JAX/Flax."""

import pathlib
import shutil

import setuptools
from setuptools.command import build_py

_ROOT = pathlib.Path(__file__).resolve().parent

# Versions known to install and work together on Python 3.11 (CPU, GPU, TPU).
INSTALL_REQUIRES = [
    "absl-py==2.5.1",
    "flax==0.12.8",
    "gin-config==0.5.0",
    # tensorflow_datasets (through seqio) imports it without declaring it.
    "importlib-resources==7.1.0",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    # The benchmark's plot of speedup vs gamma.
    "matplotlib==3.11.2",
    "msgpack==1.2.4",
    "numpy==2.4.6",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "sacrebleu==2.6.0",
    "safetensors==0.8.0",
    "sentencepiece==0.2.3",
    # seqio brings TensorFlow (about 2.4 GB) for its tasks and vocabularies.
    "seqio==0.0.20",
    "tensorstore==0.1.86",
    "tqdm==4.70.1",
]

# Test-only: the PyTorch reference T5. torch is pinned exactly: an unpinned
# torch pulls a multi-GB CUDA build.
TEST_REQUIRES = [
    # The notebooks' test runs them headless.
    "ipykernel==7.4.0",
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "pyink==26.5.1",
    "pytest==9.2.0",
    # Two test processes: on 2 cores the suite takes about 0.6 of the time.
    "pytest-xdist==3.8.0",
    "scipy==1.17.1",
    "torch==2.13.0",
    "transformers==5.24.0",
]


def _demo_files():
  """The demo's vocabulary, test inputs and trained pair, as package data."""
  package = _ROOT / "spec_decode"
  return [
      str(path.relative_to(package))
      for path in (package / "demo").rglob("*")
      if path.is_file()
  ]


class BuildPy(build_py.build_py):
  """build_py that also copies configs/ into the package.

  An installed wheel's `gin_config.CONFIG_DIR` is that copy; a checkout and
  an editable install read configs/ itself.
  """

  def run(self):
    super().run()
    destination = pathlib.Path(self.build_lib) / "spec_decode" / "configs"
    for path in (_ROOT / "configs").rglob("*.gin"):
      target = destination / path.relative_to(_ROOT / "configs")
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(path, target)


setuptools.setup(
    name="spec_decode",
    version="0.1.0",
    description="Speculative decoding for encoder-decoder Transformers in JAX",
    packages=setuptools.find_packages(include=["spec_decode", "spec_decode.*"]),
    # The demo's vocabulary, test inputs and trained pair; the CPU kernel's
    # source, which compiles on first use.
    package_data={
        "spec_decode": _demo_files(),
        "spec_decode.kernels": ["*.cc", "*.h"],
    },
    cmdclass={"build_py": BuildPy},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
)
