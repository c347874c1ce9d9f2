"""Every public name's docstring carries a runnable example, and every example runs.

The ```python blocks of the docstring of each public name of `eqxopt` and of
`eqxopt.schedules` are run in a fresh namespace holding nothing but the builtins, so
each example must import what it uses. Each name also needs an entry in an API page
(`docs/api/*.md`).
"""

import inspect
import pathlib
import re
import textwrap
import types

import jax
import pytest

import eqxopt
import eqxopt.schedules


ROOT = pathlib.Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^[ \t]*```python[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)


def _public(module, prefix):
    return {
        f"{prefix}{name}": getattr(module, name)
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), types.ModuleType)
    }


PUBLIC = {
    **_public(eqxopt, "eqxopt."),
    **_public(eqxopt.schedules, "eqxopt.schedules."),
}

# One entry per object: the Optax-named schedule aliases share their class' docstring.
_CANONICAL: dict[int, str] = {}
for _name, _obj in sorted(PUBLIC.items(), key=lambda kv: (kv[0].islower(), kv[0])):
    _CANONICAL.setdefault(id(_obj), _name)
DOCUMENTED = sorted(set(_CANONICAL.values()))


def _examples(obj) -> list[str]:
    doc = inspect.getdoc(obj) or ""
    return [textwrap.dedent(block) for block in _BLOCK.findall(doc)]


def test_public_names_are_found():
    assert len(PUBLIC) > 100 and "eqxopt.Adam" in PUBLIC
    assert "eqxopt.schedules.Constant" in PUBLIC
    assert "eqxopt.importlib" not in PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_has_an_example(name):
    assert _examples(PUBLIC[name]), (
        f"The docstring of `{name}` has no ```python example (inside a "
        "`!!! Example` admonition)."
    )


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_has_an_api_entry(name):
    pages = "\n".join(p.read_text() for p in sorted((ROOT / "docs/api").glob("*.md")))
    canonical = _CANONICAL[id(PUBLIC[name])]
    assert re.search(rf"^\s*::: {re.escape(canonical)}\s*$", pages, re.M), (
        f"No `::: {canonical}` entry in docs/api/*.md."
    )
    if name != canonical:  # an alias: named on the page of the object it aliases
        assert f"`{name}`" in pages, f"`{name}` is not mentioned in docs/api/*.md."


@pytest.mark.parametrize("name", DOCUMENTED)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Examples are written for users' defaults: standard promotion (x64 stays as the
    # suite has it).
    with jax.numpy_dtype_promotion("standard"):
        for i, code in enumerate(_examples(PUBLIC[name])):
            namespace: dict = {"__name__": "__docstring_example__"}
            try:
                exec(compile(code, f"{name}[example {i}]", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"Example {i} of `{name}` failed:\n{code}") from e
