"""Every example in a public docstring runs.

Examples are fenced ```python blocks. A block written as a doctest (`>>>` prompts) is run
by `doctest` and its printed output compared; any other block is executed as a script.
Each block starts from a namespace holding `geomjax`, `jax`, `jnp` and `np`, and the blocks
of one docstring share it, in order.
"""

import doctest
import inspect
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax

_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def _public_objects():
    seen, out = set(), []
    modules = [("geomjax", geomjax), ("geomjax.models", geomjax.models), ("geomjax.diagnostics", geomjax.diagnostics)]
    for prefix, module in modules:
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if inspect.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if callable(obj) or isinstance(obj, type):
                out.append((f"{prefix}.{name}", obj))
                if isinstance(obj, type):
                    for attr, member in sorted(vars(obj).items()):
                        if not attr.startswith("_") and callable(member) and member.__doc__:
                            out.append((f"{prefix}.{name}.{attr}", member))
    return out


def _examples():
    cases = []
    for qualname, obj in _public_objects():
        doc = inspect.getdoc(obj) or ""
        blocks = [textwrap.dedent(b) for b in _FENCE.findall(doc)]
        if blocks:
            cases.append(pytest.param(qualname, blocks, id=qualname))
    return cases


def _namespace():
    return {"geomjax": geomjax, "jax": jax, "jnp": jnp, "np": np}


@pytest.mark.parametrize("qualname, blocks", _examples())
def test_docstring_examples_run(qualname, blocks):
    namespace = _namespace()
    for block in blocks:
        if ">>>" in block:
            parser = doctest.DocTestParser()
            test = parser.get_doctest(block, namespace, qualname, None, 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report = []
            result = runner.run(test, out=report.append)
            assert result.failed == 0, f"{qualname}:\n" + "".join(report)
            namespace.update(test.globs)
        else:
            exec(compile(block, f"<{qualname} example>", "exec"), namespace)


def test_examples_were_found():
    assert len(_examples()) >= 40
