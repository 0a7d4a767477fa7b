"""Apptainer/Singularity sandboxes for trajkit: one isolated instance per prompt.

Rows route here with ``"backend": "singularity"`` or with an image only this backend understands: a
``*.sif`` file, an Apptainer sandbox directory, or a ``docker://``, ``oras://``, ``library://`` or
``shub://`` reference (converted once into a cached SIF).
"""

from trajkit_singularity.backend import SingularityBackend

__version__ = "0.1.0"
__all__ = ["SingularityBackend", "__version__"]
