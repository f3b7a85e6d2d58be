"""The one native part: memfs.reconcile._lstat (why: see its source). Metadata is in
pyproject.toml; this file only declares the extension, which setuptools cannot do there."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("memfs.reconcile._lstat", ["memfs/reconcile/_lstat.c"],
                             extra_compile_args=["-O2", "-Wall", "-Werror", "-pthread"],
                             extra_link_args=["-pthread"])])
