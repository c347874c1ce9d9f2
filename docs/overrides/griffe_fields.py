"""Griffe extension for the API pages: every field of every public state, report and
result is listed.

For a public `eqx.Module` that is not an optimizer, a line search or a schedule (whose
fields are the constructor's arguments, documented there), a table of its fields and
their types is appended to the docstring. For an `eqx.Enumeration` (`RESULTS`,
`LineSearchResult`), a table of its values and their messages.
"""

import collections.abc
import dataclasses
import inspect
import re
from typing import Any

import equinox as eqx
import griffe


_CLEAN = [
    (re.compile(r"<class '([^']*(?:'[^']*')*[^']*)'>"), r"\1"),
    (re.compile(r"\b(?:jax\.)?jaxlib\._jax\."), ""),
    (re.compile(r"\bjax\.Array\b"), "Array"),
    (re.compile(r"\bjaxtyping\."), ""),
    (re.compile(r"\btyping\."), ""),
    (re.compile(r"\beqxopt\.[\w.]*\.(?=[A-Z])"), ""),
    (re.compile(r"\bnumpy\."), "np."),
]


def _type(annotation: Any) -> str:
    if isinstance(annotation, str):
        text = annotation
    elif inspect.isclass(annotation) and not hasattr(annotation, "dim_str"):
        text = annotation.__qualname__
    else:
        text = repr(annotation)
    if text.startswith("<class '") and text.endswith("'>"):
        text = text[len("<class '") : -len("'>")]
    for pattern, repl in _CLEAN:
        text = pattern.sub(repl, text)
    return text  # inside a code span: a table does not split on its `|`


def _is_documented_by_constructor(cls: type) -> bool:
    import eqxopt

    bases = [eqxopt.AbstractOptimizer, eqxopt.AbstractLineSearch]
    bases.append(eqxopt.schedules.AbstractSchedule)
    return any(issubclass(cls, b) for b in bases)


def fields_table(cls: type) -> str | None:
    """Markdown listing the fields of `cls`, or None if it gets none."""
    if isinstance(cls, type(eqx.Enumeration)) and cls is not eqx.Enumeration:
        names = getattr(cls, "_name_to_item", {})
        if not names:
            return None
        rows = ["| value | meaning |", "| --- | --- |"]
        for name, item in names.items():
            message = cls[item] or "success"
            message = " ".join(message.split()).replace("\\|", "\\Vert{}")
            message = message.replace("|", "\\|")
            rows.append(f"| `{cls.__name__}.{name}` | {message} |")
        return "**Values:**\n\n" + "\n".join(rows)
    if not (inspect.isclass(cls) and issubclass(cls, eqx.Module)):
        return None
    if _is_documented_by_constructor(cls) or not dataclasses.is_dataclass(cls):
        return None
    fields = [f for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    if not fields:
        return "**Fields:** none (an empty state holds no arrays)."
    rows = ["| field | type |", "| --- | --- |"]
    for f in fields:
        rows.append(f"| `{f.name}` | `{_type(f.type)}` |")
    return "**Fields:**\n\n" + "\n".join(rows)


def _aliases() -> list[tuple[Any, str]]:
    from jax.typing import DTypeLike

    from eqxopt import _custom_types as t

    aliases = {name: getattr(t, name) for name in ["ScalarOrSchedule", "ScalarLike"]}
    aliases.update(Schedule=t.Schedule, ArrayLike=t.ArrayLike, DTypeLike=DTypeLike)
    out = []
    for name, alias in aliases.items():
        out += [(alias, name), (alias | None, f"{name} | None")]
    return out


def alias_name(annotation: Any) -> str | None:
    """`ScalarOrSchedule` for the union it stands for (type aliases are expanded at
    runtime, which would print a 20-line union in every signature). `ScalarLike` and
    `ArrayLike` are equal unions: the order of their members tells which was written."""
    import typing

    aliases = _aliases()
    members = typing.get_args(annotation)
    for alias, name in aliases:
        if members and members == typing.get_args(alias):
            return name
    for alias, name in aliases:
        try:
            if annotation == alias:
                return name
        except Exception:
            continue
    return None


def annotation_text(annotation: Any) -> str | None:
    """The annotation as written, with each alias under its name (`tuple[ScalarLike,
    ScalarLike]`), or None if it holds no alias."""
    import types
    import typing

    name = alias_name(annotation)
    if name is not None:
        return name
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is None or not args:
        return None
    texts = [annotation_text(a) for a in args]
    if all(t is None for t in texts):
        return None
    texts = [_type(a) if t is None else t for a, t in zip(args, texts)]
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if t == "NoneType" else t for t in texts)
    if origin is collections.abc.Callable:  # Callable[[A, B], R]: args are (A, B, R)
        texts = [f"[{', '.join(texts[:-1])}]", texts[-1]]
    return f"{getattr(origin, '__name__', _type(origin))}[{', '.join(texts)}]"


class ListFields(griffe.Extension):
    def on_function_instance(self, *, node, func, agent, **kwargs) -> None:
        obj = getattr(node, "obj", None)
        # A dataclass's generated `__init__` has `object.__init__`'s docstring
        # ("Initialize self. See help(type(self))..."), which would be merged into
        # the class's.
        generated = inspect.cleandoc(object.__init__.__doc__ or "")
        if func.name == "__init__" and func.docstring is not None:
            if func.docstring.value.strip() == generated:
                func.docstring = None
        try:
            signature = inspect.signature(obj)  # pyright: ignore[reportArgumentType]
        except (TypeError, ValueError):
            return
        for param in func.parameters:
            runtime = signature.parameters.get(param.name)
            if runtime is None or runtime.annotation is inspect.Parameter.empty:
                continue
            text = annotation_text(runtime.annotation)
            if text is not None:
                param.annotation = text

    def on_class_instance(self, *, node, cls, agent, **kwargs) -> None:
        obj = getattr(node, "obj", None)
        if obj is None or not getattr(obj, "__module__", "").startswith("eqxopt"):
            return
        doc = cls.docstring.value if cls.docstring else ""
        if "**Fields:**" in doc or "**Values:**" in doc or "**Attributes:**" in doc:
            return
        table = fields_table(obj)
        if table is None:
            return
        # Before the example, if there is one: what the object holds comes first.
        marker = "\n!!! Example"
        if marker in doc:
            head, tail = doc.split(marker, 1)
            new = head.rstrip() + "\n\n" + table + "\n" + marker + tail
        else:
            new = doc.rstrip() + "\n\n" + table
        if cls.docstring:
            cls.docstring.value = new
        else:
            cls.docstring = griffe.Docstring(new, parent=cls)
