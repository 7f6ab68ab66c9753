"""The local Kubernetes test bed: build script, cluster runner, kwok stages."""
