"""Training tests run their tiny models on one CPU thread: with models this small, a second
thread only adds synchronisation, and on a busy machine it can slow a step tenfold."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
