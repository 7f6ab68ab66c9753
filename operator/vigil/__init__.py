"""Vigil: a Kubernetes-native job scheduler that stays correct when the network lies."""

# The one version of a release: the package (pyproject reads it), the chart's version and appVersion, the
# image's tag and every artifact of `make dist` agree with it (tests/unit/deploy/test_version.py).
__version__ = "0.2.0"
