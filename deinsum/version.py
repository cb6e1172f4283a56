"""The package version, at the bottom of the layers so that every module may name it."""
__version__ = "0.1.0"
