"""Reading the arrays a traced program forms (structure tests: no dense matrix where a
sparse or matrix-free path is promised)."""


def jaxpr_shapes(jaxpr):
    """The shapes of every value of a jaxpr and of the jaxprs inside it."""
    out = []
    for eqn in jaxpr.eqns:
        out += [tuple(v.aval.shape) for v in eqn.outvars]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += jaxpr_shapes(inner)
    return out
