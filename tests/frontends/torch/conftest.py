import pytest

try:
    import torch
except ImportError:  # the tests here skip themselves (pytest.importorskip)
    torch = None


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with Dynamo's caches empty and the kiln backend registered."""
    if torch is None:
        yield
        return
    from kiln.dynamo import register
    register()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
