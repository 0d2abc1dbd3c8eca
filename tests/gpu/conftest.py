import pytest


@pytest.fixture
def measured(record_testsuite_property, request):
    """``measured(key, value)``: a value the test measured (an error against the CPU's float32, a ratio), kept in the
    JUnit XML of ``--junitxml`` as a property named ``<test>:<key>``, so a GPU run shows how close it came."""
    return lambda key, value: record_testsuite_property(f"{request.node.name}:{key}", value)
