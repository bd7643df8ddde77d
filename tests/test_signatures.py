"""Every public callable has a real signature (`inspect.signature`, `help`, IDEs): for a
class, not `()` unless it takes no arguments (an abstract base, or an enumeration that
is never constructed)."""

import inspect

import equinox as eqx
import pytest

import geomjax

_MODULES = [("geomjax", geomjax), ("geomjax.models", geomjax.models), ("geomjax.diagnostics", geomjax.diagnostics)]


def _public():
    out, seen = [], set()
    for prefix, module in _MODULES:
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in sorted(names):
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            out.append(pytest.param(obj, id=f"{prefix}.{name}"))
    return out


def _takes_no_arguments(cls) -> bool:
    """Classes whose `()` is the truth: abstract bases (never instantiated themselves),
    equinox enumerations (their items are class attributes) and builders whose own
    `__init__(self)` takes nothing (`geomjax.models.RigidBodies`: bodies are added after)."""
    own_init = vars(cls).get("__init__")
    empty_builder = own_init is not None and list(inspect.signature(own_init).parameters) == ["self"]
    return inspect.isabstract(cls) or issubclass(cls, eqx.Enumeration) or cls.__name__.startswith("Abstract") or empty_builder


@pytest.mark.parametrize("obj", _public())
def test_public_callable_has_a_signature(obj):
    sig = inspect.signature(obj)  # raises ValueError/TypeError where there is none
    if isinstance(obj, type) and not _takes_no_arguments(obj):
        assert sig.parameters, f"{obj.__name__} shows the signature (), but it takes arguments"
        # not a bare (*args, **kwargs) pass-through either
        kinds = {p.kind for p in sig.parameters.values()}
        assert kinds - {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, (
            f"{obj.__name__} shows only {sig}"
        )


def test_the_public_list_is_not_empty():
    assert len(_public()) > 100


def test_system_signature_is_its_builders_and_binds():
    sig = inspect.signature(geomjax.System)
    assert list(sig.parameters) == [
        "hamiltonian", "structure", "holonomic", "constraints", "integrals", "nonholonomic", "names",
    ]
    assert sig.parameters["holonomic"].kind is inspect.Parameter.KEYWORD_ONLY
    bound = sig.bind(lambda x: x @ x, geomjax.canonical(1), integrals=())
    system = geomjax.System(*bound.args, **bound.kwargs)
    assert isinstance(system, geomjax.HamiltonianSystem)
    # the typed systems keep their own (dataclass) signatures
    assert list(inspect.signature(geomjax.HolonomicSystem).parameters)[:3] == ["hamiltonian", "structure", "holonomic"]
    assert "System(hamiltonian" in inspect.getdoc(geomjax.System) or "hamiltonian" in str(sig)
