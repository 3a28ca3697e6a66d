"""The examples in the library's docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import hwprofile
import iostack
import moment
import momentbase
import planner
import training

PACKAGES = (momentbase, planner, iostack, hwprofile, training, moment)

MODULES = sorted(
    [pkg.__name__ for pkg in PACKAGES]
    + [m.name
       for pkg in PACKAGES
       for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
       if not m.name.endswith("__main__")]
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
