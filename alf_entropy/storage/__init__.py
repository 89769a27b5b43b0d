"""What a run keeps on disk: its directory (lock, operative config) and its checkpoints."""
