"""Front end: kbp-graph JSON -> checked, typed IR."""
