"""Every public constructor follows the Optax function of the same name
(design.md#conventions): the same argument names, in the same order, with the same
defaults, where one `state_dtype` stands for Optax's `mu_dtype` / `accumulator_dtype`.
"""

import inspect
import re
import warnings

import optax
import pytest

import eqxopt

from .helpers import CASES


# eqxopt's names for Optax's: one `state_dtype` for every buffer dtype, and the
# core wrappers' `optimizer(s)` / `labels` (design.md#conventions).
_RENAMED = {
    "mu_dtype": "state_dtype",
    "accumulator_dtype": "state_dtype",
    "dtype_momentum": "state_dtype",
}
_WRAPPERS = {"ApplyIfFinite", "MultiSteps", "Masked", "Partition", "ScheduleFree"}
_WRAPPER_RENAMED = {
    "inner": "optimizer",
    "base_optimizer": "optimizer",
    "transforms": "optimizers",
    "param_labels": "labels",
}
_PLAIN = (bool, int, float, str, tuple, type(None))  # defaults compared by value
# Where the docs fix another signature than Optax's, and why.
_API_DIFFERS = {
    "Muon": "The docs give Muon the reference's (Keller Jordan's) arguments",
    "ScaleByLearningRate": "The docs: `ScaleByLearningRate(learning_rate)`, required",
    "Chain": "`Chain(*optimizers)`: nothing to compare",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _optax_namesake(cls):
    """The Optax function named like `cls` (`ScaleByAdam` -> `scale_by_adam`, `AdamW`
    -> `adamw`, `COCOB` -> `contrib.cocob`), or `None`."""
    for candidate in (_snake(cls.__name__), cls.__name__.lower()):
        for namespace in (optax.contrib, optax):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:  # skip Optax's deprecated aliases (`optax.dpsgd`)
                    fn = getattr(namespace, candidate, None)
                except DeprecationWarning:
                    continue
            if inspect.isfunction(fn):
                return fn
    return None


def _resolve(dotted: str):
    out = optax
    for part in dotted.split("."):
        out = getattr(out, part)
    return out


def _public_optimizers():
    for name in sorted(dir(eqxopt)):
        obj = getattr(eqxopt, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, eqxopt.AbstractOptimizer)
            and not inspect.isabstract(obj)
            and not name.startswith("Abstract")
        ):
            yield obj


def _pairs():
    # Names Optax spells differently come from the registry (`Case.optax_fn`).
    overrides = {type(c.make()): _resolve(c.optax_fn) for c in CASES if c.optax_fn}
    pairs = {}
    for cls in _public_optimizers():
        fn = overrides.get(cls) or _optax_namesake(cls)
        if fn is not None:
            pairs[cls] = fn
    return sorted(pairs.items(), key=lambda kv: kv[0].__name__)


PAIRS = _pairs()


def test_the_check_covers_the_catalogue():
    names = {cls.__name__ for cls, _ in PAIRS}
    assert {"SGD", "Adam", "AdamW", "ScaleByAdam", "Lion", "LBFGS", "Muon"} <= names
    assert len(PAIRS) >= 60


@pytest.mark.parametrize("cls, fn", PAIRS, ids=[c.__name__ for c, _ in PAIRS])
def test_constructor_follows_optax_signature(cls, fn):
    if cls.__name__ in _API_DIFFERS:
        pytest.skip(_API_DIFFERS[cls.__name__])
    ours = list(inspect.signature(cls).parameters.values())
    theirs = list(inspect.signature(fn).parameters.values())
    if {"key", "seed"} <= {p.name for p in theirs}:  # Optax's deprecated `seed`
        theirs = [p for p in theirs if p.name != "seed"]
    # Optax's keyword-only options (`mask_compatible_extra_args`) are not required:
    # eqxopt forwards every extra argument to every child.
    theirs = [p for p in theirs if p.kind is p.POSITIONAL_OR_KEYWORD]
    renamed = _RENAMED | (_WRAPPER_RENAMED if cls.__name__ in _WRAPPERS else {})
    names = [renamed.get(p.name, p.name) for p in theirs]
    positional = [p.name for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
    # Optax's arguments come first, in Optax's order; extra options may follow.
    assert positional[: len(names)] == names[: len(positional)], (
        f"{cls.__name__}{inspect.signature(cls)} vs optax.{fn.__name__}"
        f"{inspect.signature(fn)}"
    )
    by_name = {p.name: p for p in ours}
    for p in theirs:
        mine = by_name.get(renamed.get(p.name, p.name))
        assert mine is not None, f"{cls.__name__} lacks Optax's `{p.name}`"
        if mine.name == "state_dtype" or type(p.default) not in _PLAIN:
            continue  # API rule 1 sets the dtype; objects (line searches) differ
        assert mine.default == p.default, p.name


@pytest.mark.parametrize(
    "cls, fn",
    [
        (eqxopt.DPSGD, optax.contrib.dpsgd),
        (
            eqxopt.DifferentiallyPrivateAggregate,
            optax.contrib.differentially_private_aggregate,
        ),
        (eqxopt.SAM, optax.contrib.sam),
        (eqxopt.Sophia, optax.contrib.sophia),
        (eqxopt.ReduceOnPlateau, optax.contrib.reduce_on_plateau),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_positional_order_follows_optax(cls, fn):
    ours = [n for n in inspect.signature(cls).parameters]
    theirs = [
        "state_dtype" if n == "mu_dtype" else n
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert ours[: len(theirs)] == theirs
