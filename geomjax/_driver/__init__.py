"""The integration driver: the compiled loop, its solution and the diffrax adapters."""
