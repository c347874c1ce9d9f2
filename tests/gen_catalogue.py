"""Generate docs/catalogue.md from the test registry.

    python -m tests.gen_catalogue > docs/catalogue.md

tests/test_docs.py fails if the committed page differs from what this prints, so the
table can never drift from what is actually tested.
"""

import inspect

import jax.tree_util as jtu
import optax

import eqxopt

from .helpers import CASES


def _optax_names(fn) -> list[str]:
    """The Optax functions a reference lambda calls, e.g. `optax.contrib.muon`."""
    names, code = [], fn.__code__
    consts = [c for c in code.co_consts if inspect.iscode(c)]
    for c in [code, *consts]:
        for name in c.co_names:
            for prefix, module in (
                ("optax.contrib.", optax.contrib),
                ("optax.", optax),
            ):
                obj = getattr(module, name, None)
                if callable(obj) and name not in ("apply_updates", "tree"):
                    full = prefix + name
                    if full not in names and "optax." + name not in names:
                        names.append(full)
                    break
    return names


def _classes(opt) -> list[str]:
    """Every eqxopt optimizer class inside `opt` (itself first)."""
    found = []
    for x in jtu.tree_leaves(
        opt, is_leaf=lambda x: isinstance(x, eqxopt.AbstractOptimizer) and x is not opt
    ):
        if isinstance(x, eqxopt.AbstractOptimizer):
            found.extend(_classes(x))
    return [type(opt).__name__] + found


def _summary(obj) -> str:
    """The first sentence of the docstring, on one line (a table cell), as the API
    pages' summary tables have it."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "docs" / "overrides" / "hooks.py"
    spec = importlib.util.spec_from_file_location("_docs_hooks", path)
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.first_sentence(inspect.getdoc(obj) or "")


def _public_optimizers() -> list[str]:
    out = []
    for name in dir(eqxopt):
        obj = getattr(eqxopt, name)
        if (
            inspect.isclass(obj)
            and issubclass(obj, eqxopt.AbstractOptimizer)
            and not inspect.isabstract(obj)
            and not name.startswith("Abstract")
        ):
            out.append(name)
    return sorted(out, key=str.lower)


def main() -> str:
    built = [(case, case.make()) for case in CASES]
    lines = [
        "# Catalogue and tests",
        "",
        "Every public optimizer, transform and wrapper, and the Optax function whose",
        "numbers it is checked against (with the relative tolerance of that check in",
        "float32 / float64; the loosest, where several configurations are checked).",
        "Every one is also tested for the dtype rules (float16, bfloat16, float32 and",
        "float64 params, float32 grads), as a `lax.scan` carry and `lax.cond` output,",
        "for tracing once, tracer leaks and serialisation; the test cases are in",
        "`tests/registry/`.",
        "",
        "| eqxopt | summary | checked against Optax (rtol) |",
        "| --- | --- | --- |",
    ]
    for name in _public_optimizers():
        own = [(c, o) for c, o in built if type(o).__name__ == name]
        inside = [(c, o) for c, o in built if name in _classes(o)[1:]]
        checked = [c for c, _ in own if c.reference]
        if checked:
            refs = sorted({n for c in checked for n in _optax_names(c.reference)[:1]})
            rtol = max(c.rtol for c in checked), max(c.rtol64 for c in checked)
            # `contrib.<wbr>name`: the name may start a new line in a narrow column.
            ref = ", ".join(
                f"<code>{r.removeprefix('optax.').replace('.', '.<wbr>')}</code>"
                for r in refs
            )
            ref += f" ({rtol[0]:g} / {rtol[1]:g})"
        elif own:
            ref = "none: property tests"
        elif inside:
            ref = "inside the optimizers that use it"
        else:
            ref = "none: tests of its own"
        summary = _summary(getattr(eqxopt, name))
        lines.append(f"| [`{name}`][eqxopt.{name}] | {summary} | {ref} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(), end="")
