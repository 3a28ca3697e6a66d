"""momentbase.registry: an ordered name -> implementation table, lazily imported, with capabilities."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from momentbase.errors import MomentError
from momentbase.registry import Registry, RegistryError, resolve
from tests.conftest import REPO


class ToyError(MomentError):
    pass


def test_lazy_entries_import_on_first_get_only():
    code = ("import sys\nfrom momentbase.registry import Registry\n"
            "r = Registry('thing')\nr.register('frac', 'fractions:Fraction', exact=True)\n"
            "assert 'fractions' not in sys.modules and r.names() == ('frac',) and r.caps('frac')['exact']\n"
            "assert r.get('frac')(1, 2) == 0.5 and 'fractions' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)})


def test_unknown_names_give_one_line_listing_the_known():
    r: Registry = Registry("toy", ToyError)
    r.register("a", len)
    r.register("b", "os.path:join")
    with pytest.raises(ToyError, match=r"^unknown toy 'c' \(known: a, b\)$"):
        r.get("c")
    with pytest.raises(ToyError, match="unknown toy 'c'"):
        r.unregister("c")
    with pytest.raises(RegistryError, match=r"known: none"):
        Registry("empty").caps("x")
    assert issubclass(RegistryError, MomentError) and issubclass(RegistryError, LookupError)


def test_an_unloadable_entry_is_the_registrys_error_naming_it():
    r: Registry = Registry("toy", ToyError)
    r.register("gone", "momentbase.no_such_module:thing")
    r.register("typo", "momentbase.units:no_such_name")
    for name in ("gone", "typo"):
        with pytest.raises(ToyError, match=f"toy '{name}' cannot be loaded from momentbase"):
            r.get(name)


def test_register_refuses_a_taken_name_unless_replacing_and_bad_targets():
    r: Registry = Registry("toy")
    r.register("a", len)
    with pytest.raises(ValueError, match="registered already"):
        r.register("a", abs)
    r.register("a", abs, replace=True)
    assert r.get("a") is abs
    with pytest.raises(ValueError, match="non-empty name"):
        r.register("", abs)
    with pytest.raises(ValueError, match="expected 'package.module:attr'"):
        resolve("os.path.join")
    with pytest.raises(ValueError, match="is not 'package.module:attr'"):
        r.register("b", "os.path.join")  # refused when registered, not when first used


def test_decorator_and_context_manager():
    r: Registry = Registry("toy")

    @r.register("double", cheap=True)
    def double(x):
        return 2 * x

    assert double(2) == 4 and r.get("double") is double and r.caps("double") == {"cheap": True}
    with pytest.raises(TypeError):
        r.caps("double")["cheap"] = False  # capabilities are read-only
    with r.registered("triple", lambda x: 3 * x):
        assert r.get("triple")(2) == 6 and "triple" in r
    assert "triple" not in r and r.names() == ("double",)
    with pytest.raises(RuntimeError), r.registered("boom", abs):
        raise RuntimeError
    assert "boom" not in r  # removed even when the block fails


@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abcdef")), max_size=40))
def test_names_keep_registration_order_through_any_sequence(ops):
    r: Registry = Registry("toy")
    model: list[str] = []
    for add, name in ops:
        if add and name not in model:
            r.register(name, len)
            model.append(name)
        elif not add and name in model:
            r.unregister(name)
            model.remove(name)
    assert r.names() == tuple(model) == tuple(r) and len(r) == len(model)
