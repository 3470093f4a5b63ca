"""Static checks of environment sources: each bad source is refused with a message naming it."""

import pytest
from pydantic import ValidationError

from workers.environments import EnvironmentConfig, check_source

STEP = "def step(messages, record):\n    return {'reward': 0.0, 'done': True}\n"


def test_a_minimal_source_passes_and_reports_what_it_defines():
    assert check_source(STEP).has_reset is False
    src = STEP + (
        "def reset(record):\n    return 'hi'\n"
        "def add(a: int, b: 'int' = 1) -> int:\n    '''Add.'''\n    return a + b\n"
        "tools = [add]\n"
    )
    info = check_source(src)
    assert info.has_reset is True and info.tools == ("add",)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def step(messages, record)\n    return 1\n", "SyntaxError"),
        ("def reset(record):\n    return 'x'\n", "top-level function `step"),
        ("step = lambda m, r: None\n", "must be a plain function"),
        ("async def step(messages, record):\n    pass\n", "must be a plain function"),
        ("def step(messages):\n    pass\n", "takes 1 positional argument(s)"),
        ("def step(a, b, c):\n    pass\n", "takes 3 positional argument(s)"),
        (STEP + "def reset():\n    return ''\n", "`reset` takes 0"),
        (STEP + "tools = 'add'\n", "a list of functions"),
        (STEP + "tools = [print]\n", "tool `print` must be a plain top-level function"),
        (STEP + "tools = [lambda x: x]\n", "list functions by name"),
        (STEP + "def f(x: int):\n    return x\ntools = [f]\n", "needs a docstring"),
        (STEP + "def f(x):\n    '''F.'''\ntools = [f]\n", "parameter `x` needs a type hint"),
        (STEP + "def f(*a: int):\n    '''F.'''\ntools = [f]\n", "*args or **kwargs"),
        (STEP + "def f(x: set):\n    '''F.'''\ntools = [f]\n", "has type 'set'"),
        (STEP + "def f(x: int):\n    '''F.'''\ntools = [f, f]\n", "listed twice"),
    ],
)
def test_bad_sources_are_refused_naming_the_problem(source, message):
    with pytest.raises(ValueError) as info:
        check_source(source)
    assert message in str(info.value)


def test_config_bounds_and_source_errors_surface_on_their_field():
    assert EnvironmentConfig(source=STEP).timeout_s == 10.0
    with pytest.raises(ValidationError) as info:
        EnvironmentConfig(source="def nothing():\n    pass\n")
    [error] = info.value.errors()
    assert error["loc"] == ("source",) and "step" in error["msg"]
    for bad in (0, 301, "5"):
        with pytest.raises(ValidationError):
            EnvironmentConfig(source=STEP, timeout_s=bad)
    with pytest.raises(ValidationError):
        EnvironmentConfig(source=STEP, extra=1)
    with pytest.raises(ValidationError):
        EnvironmentConfig(source="#" * (256 * 1024 + 1))
