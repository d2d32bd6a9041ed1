"""See the graph: one model's graphs at every pipeline stage (``stages``), per-node measurements carried across
them by provenance (``overlays``), written for Google's Model Explorer and as one self-contained HTML report."""
