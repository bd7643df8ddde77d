"""Statuses through one door: only `geomjax/_status.py` reads equinox's private enumeration
storage, so a change in equinox breaks one module, which this file tests."""

import pathlib
import re

import equinox as eqx
import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax._tuning.fit import FIT_RESULTS
from geomjax._status import RESULTS, code_int, code_of, from_code, status_messages, status_names

PRIVATE = re.compile(r"\._value\b|_name_to_item|_index_to_message")


def test_no_module_but_status_reads_equinox_enumeration_internals():
    root = pathlib.Path(geomjax.__file__).parent
    offenders = [str(f.relative_to(root)) for f in root.rglob("*.py")
                 if f.name != "_status.py" and PRIVATE.search(f.read_text())]
    assert offenders == []


def test_the_status_helpers_round_trip_through_equinox():
    for enumeration in (RESULTS, FIT_RESULTS):
        names = status_names(enumeration)
        messages = status_messages(enumeration)
        assert len(names) == len(messages) >= 2
        for code, name in names.items():
            item = getattr(enumeration, name)
            assert code_int(item) == code
            assert from_code(code, enumeration) == item
            assert isinstance(from_code(code, enumeration), type(item))
    batch = from_code(jnp.array([0, 4]))
    np.testing.assert_array_equal(np.asarray(code_of(batch)), [0, 4])
    assert status_names()[code_int(RESULTS.diverged)] == "diverged"
    assert status_messages()[code_int(RESULTS.newton_failed)] == RESULTS[RESULTS.newton_failed]


def test_fit_error_is_an_equinox_runtime_error_like_integration_error():
    assert issubclass(geomjax.FitError, eqx.EquinoxRuntimeError)
    assert issubclass(geomjax.IntegrationError, eqx.EquinoxRuntimeError)
