"""The tier-1 engine: one channel folder of segment files (see DESIGN.md "Layers")."""
