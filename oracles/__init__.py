"""float64 numpy reference implementations (the specification). Never imports torch."""
