"""Default names of monitored quantities (a leaf: imports nothing of geomjax)."""


def numbered(prefix: str, n: int, start: int = 0) -> tuple[str, ...]:
    """`n` labels `prefix[i]` (0-based indices), or with `start=1` the names `g1`, `g2`, …
    (a single one unnumbered, `g`): the default names of monitored entries."""
    if start:
        return (prefix,) if n == 1 else tuple(f"{prefix}{i + start}" for i in range(n))
    return tuple(f"{prefix}[{i}]" for i in range(n))
