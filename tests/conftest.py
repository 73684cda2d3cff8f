import pytest
import torch

from blindheads.datamodules.tokenizer import load_tokenizer


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _keep_subnormals_after_each_test():
    """A CLI built in the test process sets the CPU's subnormal flag from its config's threshold; the next test
    starts from the process default (subnormals kept) again."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A cache holding the builtin corpus and tokenizer, built once per test session."""
    path = tmp_path_factory.mktemp("blindheads-cache")
    load_tokenizer("builtin", path)
    return path
