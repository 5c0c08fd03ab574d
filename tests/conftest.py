"""Shared fixtures: in-process Hydra composition and a spawner for gloo ranks."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
os.environ.setdefault("WANDB_MODE", "disabled")
# Triton reads TRITON_INTERPRET when it is imported, so it is set for the whole run, before anything
# imports it: without a CUDA device the kernels run on CPU tensors through the interpreter
# (tests/compressors/test_triton.py); on a GPU they compile, as they do for users
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gvq.schema.config import register  # noqa: E402 - imported after TRITON_INTERPRET is set, above

register()

pytest_plugins = ["tests.helpers.launches"]      # counts the processes the suite starts (make test's summary)


@pytest.fixture
def compose_cfg(_composed):
    """compose_cfg(*overrides) -> the composed DictConfig, as the CLI would build it.  A composition is
    made once per worker and each test gets its own copy (the schema-wide tests compose every option
    several times over); a refusal is raised every time, never kept."""
    def _compose(*overrides, return_hydra_config=False):
        key = (overrides, return_hydra_config)
        if key not in _composed:
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=CONF, version_base="1.3"):
                _composed[key] = compose("config", overrides=list(overrides),
                                         return_hydra_config=return_hydra_config)
        return copy.deepcopy(_composed[key])
    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def _composed() -> dict:
    """What ``compose_cfg`` composed in this worker, by overrides: composition reads only conf/ and the
    registered schemas (interpolations resolve when read), so one composition serves every test."""
    return {}


def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One intra-op thread for this test (small ops: two contended threads on this 2-core host are slower)."""
    yield from _threads(1)


@pytest.fixture(scope="module")
def one_thread_per_module():
    """As ``one_thread``, for a whole module (``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield from _threads(1)


@pytest.fixture(scope="session")
def fashion_root() -> Path:
    """The folder of the real Fashion-MNIST files.  Where they are missing the test skips, except where
    ``GVQ_REQUIRE_FASHION=1`` (set by .ci/run, which installs them): there a missing data set fails."""
    from tests.helpers.data import fashion_source
    found = fashion_source()
    if found is None:
        if os.environ.get("GVQ_REQUIRE_FASHION") == "1":
            pytest.fail("GVQ_REQUIRE_FASHION=1 but Fashion-MNIST is not installed (make setup, as root)")
        pytest.skip("Fashion-MNIST not installed (make setup as root installs dataset-fashion-mnist)")
    return found


@pytest.fixture(scope="session")
def austen_folder() -> Path:
    """The folder of the real janeaustenr data (Rdata.rdb, Rdata.rdx).  Where it is missing the test skips,
    except where ``GVQ_REQUIRE_AUSTEN=1`` (set by .ci/run, whose make unpacks it): there it fails."""
    from gvq.data.r_lazyload import find_austen
    try:
        return Path(find_austen(None))
    except FileNotFoundError:
        if os.environ.get("GVQ_REQUIRE_AUSTEN") == "1":
            pytest.fail("GVQ_REQUIRE_AUSTEN=1 but r-cran-janeaustenr's data is not unpacked (make setup, as root)")
        pytest.skip("Austen's novels not installed (make setup as root unpacks r-cran-janeaustenr)")
