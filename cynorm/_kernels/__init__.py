"""Compiled kernels (Cython + OpenMP) and their C helpers."""
import pkgutil

# see cynorm/__init__.py: in a source checkout the built modules live in the
# installed copy of this package
__path__ = pkgutil.extend_path(__path__, __name__)
