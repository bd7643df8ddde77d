"""One way to tell known values from traced ones (`geomjax._validate`): `is_traced`,
`is_concrete`, `known`, `at_top_level`. Their private-JAX dependency lives there alone;
this test fails loudly when a JAX release moves it (geomjax would then count every value
under a transformation as traced: safe, but its eager checks would all move into the
compiled runs)."""

import ast
import pathlib

import jax
import jax.numpy as jnp

import geomjax
from geomjax import _validate
from geomjax._validate import at_top_level, is_concrete, is_traced, known


def test_the_private_jax_api_is_there():
    assert _validate._to_concrete_value is not None, "jax._src.core.to_concrete_value moved: update _validate"
    assert _validate._trace_ctx is not None, "jax._src.core.trace_ctx moved: update _validate"


def test_known_values_and_traced_ones():
    assert at_top_level() and float(known(jnp.asarray(2.0))) == 2.0
    seen = {}

    def probe(a):
        seen["top"], seen["known"], seen["traced"] = at_top_level(), known(a * 3.0), is_traced(a)
        return a

    jax.grad(probe)(1.0)  # eager grad: traced, but known
    assert seen == {"top": False, "known": 3.0, "traced": True}
    jax.jit(probe)(1.0)  # jit: traced and unknown
    assert seen["top"] is False and seen["known"] is None and seen["traced"]
    jax.vmap(probe)(jnp.ones(2))  # batched: unknown
    assert seen["known"] is None
    assert is_concrete({"a": jnp.ones(2), "b": 1.0})


def test_nothing_else_reads_private_jax_or_tests_for_tracers():
    """`jax._src` and `isinstance(..., Tracer)` appear in `_validate.py` only."""
    root = pathlib.Path(geomjax.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "_validate.py" and path.parent == root:
            continue
        text = path.read_text()
        if "jax._src" in text:
            offenders.append(f"{path.relative_to(root)}: jax._src")
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2
                    and "Tracer" in ast.unparse(node.args[1])):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: isinstance(…, Tracer)")
    assert not offenders, offenders
