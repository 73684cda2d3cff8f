import pytest
import torch

from blindheads.datamodules.tokenizer import load_tokenizer


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A cache holding the builtin corpus and tokenizer, built once per test session."""
    path = tmp_path_factory.mktemp("blindheads-cache")
    load_tokenizer("builtin", path)
    return path
