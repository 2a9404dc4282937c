"""Configuration: every settings model (typed, frozen: `base`), their value sets (`choices`); `sources`
alone reads config files and the environment."""
