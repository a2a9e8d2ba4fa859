"""Placeholder: the object-store layer (docs/FORMAT.md §9) lands in the next commit."""
