"""What the operator serves: one way to serve HTTP (`http`), the probes (`health`), Prometheus
metrics (`metrics`) and the admission webhook (`webhook`)."""
