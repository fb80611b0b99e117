"""Packaging beyond what pyproject.toml can say: the hand-written CUDA sources and templates stay at
the repository root (kernels/, runtime_stub/, templates/) and ship in the wheel as package data
inside kbpc (kbpc/kernels/, ...), where kbpc/toolchain/assets.py finds them."""
from setuptools import find_packages, setup

ASSET_PACKAGES = {"kbpc.kernels": "kernels", "kbpc.runtime_stub": "runtime_stub", "kbpc.templates": "templates"}

setup(packages=[*find_packages(include=["kbpc", "kbpc.*"]), *ASSET_PACKAGES], package_dir=ASSET_PACKAGES)
