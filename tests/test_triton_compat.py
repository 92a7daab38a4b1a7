"""Every name taken from Triton that moved between releases comes from one module, and under the installed Triton
each comes from the place expected for its version: a fallback taken silently fails here."""

import warnings

import triton

from flashattn.kernels import triton_compat as tc


def test_nothing_is_missing_under_the_installed_triton():
    assert tc.MISSING == {}, f"Triton {triton.__version__} lacks {tc.MISSING}: the kernels that need them are off"
    assert tc.HAS_GLUON and tc.HAS_GLUON_BACKWARD


def test_each_moved_name_comes_from_where_this_version_has_it():
    for name, expected in tc.EXPECTED.items():
        assert tc.CHOSEN[name] == expected(tc.VERSION), (
            f"{name}: Triton {triton.__version__} gave {tc.CHOSEN[name]}, expected {expected(tc.VERSION)}")


def test_a_name_found_nowhere_is_reported_and_warned():
    missing = dict(tc.MISSING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert tc._first("not_a_name", "triton:no_such_attribute", "no_such_module:x") is None
        assert "not_a_name" in tc.MISSING and any("not_a_name" in str(w.message) for w in caught)
        assert tc._first("built", "triton:no_such_attribute", private=lambda: 42) == 42
        assert tc.CHOSEN["built"] == tc.PRIVATE
    finally:
        tc.MISSING.clear()
        tc.MISSING.update(missing)
        tc.CHOSEN.pop("built", None)


def test_the_package_reaches_triton_internals_only_through_this_module():
    """The private names (``triton._C``, ``_semantic``, ``language._core``) appear in one module of the package."""
    import re
    from pathlib import Path

    package = Path(tc.__file__).resolve().parent.parent
    private = re.compile(r"triton\._C|_semantic|language\._core|from triton\.[a-z_.]*import _")
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if private.search(p.read_text()))
    assert users == ["kernels/triton_compat.py"], users


def test_the_interpreter_index_fix_is_installed_where_triton_needs_it():
    """Triton 3.6's interpreter indexes with int() of a one-element array, which NumPy 2.5 refuses; 3.7 squeezes."""
    assert (tc.INTERPRETER_INDEX_FIX is not None) == (tc.VERSION < (3, 7))
