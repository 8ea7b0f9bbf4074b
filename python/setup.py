"""Builds the compiled binding flare._native (flare/_native.c); the rest is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("flare._native", ["flare/_native.c"], libraries=["dl"])])
