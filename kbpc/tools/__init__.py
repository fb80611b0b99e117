"""Blueprint tools that are not compilation (shrink)."""
