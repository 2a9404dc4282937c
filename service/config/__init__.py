"""Configuration: every settings model (typed, frozen); `settings` alone reads files and the environment."""
