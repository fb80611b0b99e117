"""kbpc: compile kbp-graph blueprints into signed .kbp GPU bundles."""

__version__ = "0.1.0"
