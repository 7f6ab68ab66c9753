"""Talking to the API server, and nothing about jobs: the one HTTP client (`client`), its one
error hierarchy (`errors`), kubeconfig loading (`config`), list+watch that knows when it is
stale (`informer`, with its pure parts `seen` and `freshness`), the Lease store (`leases`), the
event recorder (`events`), and Vigil's few named calls (`operations`)."""
