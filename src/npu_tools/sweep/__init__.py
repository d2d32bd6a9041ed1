"""Design-space sweeps: models x hardware x precisions, costed (and the quantized ones measured for accuracy) into
one table, locally or on Ray (docs/sweep.md): ``grid`` (the points), ``engine`` (one point), ``run`` (the sweep)."""
