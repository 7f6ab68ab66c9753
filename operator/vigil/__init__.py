"""Vigil: a Kubernetes-native job scheduler that stays correct when the network lies."""

__version__ = "0.1.0"
