"""The layout of the repository: one family name for a public name's code, its docs
page, its registry file and its tests (CONTRIBUTING.md, "Where things are").

A family `F` is the package (or module) `eqxopt/_F`, the page `docs/api/F.md`, the
registry file `tests/registry/F.py` (families with optimizers) and the test files
`tests/test_F.py` / `tests/test_F_<topic>.py`."""

import ast
import importlib
import inspect
import pathlib

import jax
import pytest

import eqxopt

from .helpers import CASES


ROOT = pathlib.Path(__file__).parent.parent

# The one table: family -> (what it holds, whether it has a registry file).
FAMILIES = {
    "core": ("the optimizer protocol, typed state and its checks", False),
    "sgd": ("SGD, sign methods, Lion, LARS, noise, Fromage, Rprop, optimistic", True),
    "adam": ("Adam, AdamW and their relatives", True),
    "adaptive": ("diagonal adaptive methods without Adam's moments", True),
    "parameter_free": ("learning-rate-free methods", True),
    "matrix": ("Muon, NorMuon, SOAP, Shampoo, Kron, GaLore", True),
    "transforms": ("building blocks to chain", True),
    "wrappers": ("optimizers that wrap optimizers", True),
    "minimize": ("minimize, L-BFGS(-B), line searches, results", True),
    "least_squares": ("least_squares, curve_fit, TRF, Levenberg-Marquardt", False),
    "interop": ("to and from Optax", False),
    "checkpoint": ("saving and restoring (optimizer, state)", False),
    "sharding": ("state shardings", False),
    "schedules": ("eqxopt.schedules", False),
    "quantized": ("quantized and low-precision state storage", False),
}

# Modules every family may import private helpers from (none of them defines a public
# optimizer): shared across families at the top level, shared within a family below.
SHARED = {
    "eqxopt._misc",
    "eqxopt._checks",
    "eqxopt._custom_types",
    "eqxopt._kernels",
    "eqxopt._filter_spec",
    "eqxopt._bounds",
    "eqxopt._random",
    "eqxopt._quantized",
    "eqxopt._core.base",
    "eqxopt._adam.base",
    "eqxopt._wrappers.base",
    "eqxopt._matrix.linalg",
    "eqxopt._matrix.spread",
    "eqxopt._minimize.linesearch",
    "eqxopt._minimize.loop",
    "eqxopt._minimize.solve",
    "eqxopt._minimize.solution",
    "eqxopt._least_squares.base",
    "eqxopt._least_squares.common",
}

# Test files that run over the whole registry or the whole package, not one family.
REGISTRY_WIDE = {
    "test_benchmarks",
    "test_browser",
    "test_docs",
    "test_docstrings",
    "test_errors",
    "test_examples",
    "test_layout",
    "test_mixed_precision",
    "test_multiprocess",
    "test_no_x64",
    "test_parity",
    "test_properties",
    "test_public_apis",
    "test_randomness",
    "test_signatures",
}


def family_of_module(module: str) -> str:
    """`eqxopt._adam.nadam` -> `adam`; `eqxopt.schedules._schedules` -> `schedules`."""
    parts = module.split(".")
    assert parts[0] == "eqxopt" and len(parts) >= 2, module
    family = parts[1].removeprefix("_")
    assert family in FAMILIES, f"{module} is in no family of FAMILIES"
    return family


def _public():
    names = [(n, getattr(eqxopt, n)) for n in dir(eqxopt) if not n.startswith("_")]
    return [
        (n, obj)
        for n, obj in names
        if (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__.startswith("eqxopt.")
    ]


@pytest.mark.parametrize("name, obj", _public(), ids=[n for n, _ in _public()])
def test_a_public_name_lives_in_its_familys_code_and_docs_page(name, obj):
    family = family_of_module(obj.__module__)
    page = ROOT / "docs" / "api" / f"{family}.md"
    assert page.exists(), f"{name} is in family {family!r}, which has no {page}"
    assert f"::: eqxopt.{name}\n" in page.read_text(), (
        f"`eqxopt.{name}` ({obj.__module__}) is documented outside its family's page "
        f"docs/api/{family}.md"
    )


def test_every_family_has_its_code_page_registry_and_tests():
    for family, (_, has_registry) in FAMILIES.items():
        package = ROOT / "eqxopt" / f"_{family}"
        module = ROOT / "eqxopt" / f"_{family}.py"
        if family == "schedules":
            package = ROOT / "eqxopt" / "schedules"
        assert package.is_dir() or module.is_file(), f"no code for family {family!r}"
        assert (ROOT / "docs" / "api" / f"{family}.md").is_file(), family
        registry = ROOT / "tests" / "registry" / f"{family}.py"
        assert registry.is_file() == has_registry, (family, registry)
        tests = list((ROOT / "tests").glob(f"test_{family}*.py"))
        assert tests, f"no tests/test_{family}*.py"


def test_nothing_lies_outside_the_families():
    pages = {p.stem for p in (ROOT / "docs" / "api").glob("*.md")}
    assert pages == set(FAMILIES), pages ^ set(FAMILIES)
    registries = {
        p.stem for p in (ROOT / "tests" / "registry").glob("*.py") if p.stem[0] != "_"
    }
    assert registries == {f for f, (_, r) in FAMILIES.items() if r}
    for path in (ROOT / "tests").glob("test_*.py"):
        stem = path.stem
        assert stem in REGISTRY_WIDE or any(
            stem == f"test_{f}" or stem.startswith(f"test_{f}_") for f in FAMILIES
        ), f"{path.name} is neither a family's tests nor a registry-wide file"
    for path in (ROOT / "eqxopt").iterdir():
        if path.name.startswith("_") and path.name not in (
            "__init__.py",
            "__pycache__",
        ):
            module = "eqxopt." + path.name.removesuffix(".py")
            assert module in SHARED or path.name.removesuffix(".py")[1:] in FAMILIES, (
                f"eqxopt/{path.name} is neither a family nor a shared module"
            )


def _optimizers_in(opt):
    leaves = jax.tree.leaves(
        opt, is_leaf=lambda x: isinstance(x, eqxopt.AbstractOptimizer) and x is not opt
    )
    inner = [x for x in leaves if isinstance(x, eqxopt.AbstractOptimizer)]
    return [opt] + [o for x in inner for o in _optimizers_in(x)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_registry_case_is_in_the_file_of_a_family_it_tests(case):
    registry = case.make.__module__.rsplit(".", 1)[1]
    modules = [type(o).__module__ for o in _optimizers_in(case.make())]
    families = {family_of_module(m) for m in modules if m.startswith("eqxopt.")}
    assert registry in families, (
        f"case {case.id!r} is in tests/registry/{registry}.py but tests {families}"
    )


def test_every_optimizer_with_a_case_has_one_in_its_familys_file():
    outer = {}
    for case in CASES:
        cls = type(case.make())
        outer.setdefault(cls, set()).add(case.make.__module__.rsplit(".", 1)[1])
    for cls, registries in outer.items():
        if cls is eqxopt.Chain:
            continue
        family = family_of_module(cls.__module__)
        assert family in registries, (
            f"{cls.__name__}'s cases are in tests/registry/{registries}, "
            f"not tests/registry/{family}.py"
        )


def _relative_imports():
    for path in sorted((ROOT / "eqxopt").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        package = package.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                yield module, target, [a.name for a in node.names]


def test_no_leaf_file_lends_its_private_helpers():
    """A helper used by several files lives in a shared module; from an optimizer's
    own file others import only public names (`AdamW` as Muon's fallback)."""
    public = set(dir(eqxopt)) | set(dir(eqxopt.schedules))
    offences = []
    for module, target, names in _relative_imports():
        if module.endswith("__init__") or target in SHARED:
            continue
        try:
            importlib.import_module(target)
        except ImportError:  # `from . import schedules`-style: a package
            continue
        private = [n for n in names if n not in public]
        if private:
            offences.append(f"{module} imports {private} from {target}")
    assert not offences, "\n".join(offences)


_PRIVATE_MODULES = ("jax._src", "jaxlib", "equinox._", "optimistix._", "lineax._")
_PRIVATE_MODULES += ("optax._src",)


def _module_level_names(tree) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_only_public_apis_of_other_libraries():
    """No import of another library's private modules, and no write to a private
    attribute of a module-level object (`RESULTS._name_to_item[...] = ...`, where
    equinox owns `_name_to_item`): both break on an upgrade."""
    offences = []
    for path in sorted((ROOT / "eqxopt").rglob("*.py")):
        tree = ast.parse(path.read_text())
        module_level = _module_level_names(tree)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith(_PRIVATE_MODULES):
                    offences.append(f"{path.name}: imports {name}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for target in targets:
                    for sub in ast.walk(target):
                        if (
                            isinstance(sub, ast.Attribute)
                            and sub.attr.startswith("_")
                            and not sub.attr.startswith("__")
                            and _root(sub) in module_level
                        ):
                            offences.append(
                                f"{path.name}:{node.lineno} sets .{sub.attr}"
                            )
    assert not offences, "\n".join(offences)
