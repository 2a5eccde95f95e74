"""float64 numpy reference implementations (no torch), mirroring detsample/ops."""
