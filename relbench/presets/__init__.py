"""The shipped presets, one TOML experiment file each (see relbench.config)."""
