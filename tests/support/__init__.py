"""Test helpers shared across the suite (not part of the package)."""
