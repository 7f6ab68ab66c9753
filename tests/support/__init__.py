"""Helpers shared by the test suites: builders, watchers, namespaces, agents, proxies, waits."""
