"""Analysis of one-step methods: order conditions by Taylor expansion in the step size."""
