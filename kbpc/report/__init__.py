"""Reports about blueprints and bundles (what `kbpc inspect` prints)."""
