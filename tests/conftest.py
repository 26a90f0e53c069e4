import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread; several threads on a shared 2-core machine crawl. Files
    ask for it with pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
