"""The package version; the build backend reads it from this file."""

__version__ = "0.1.0"
