"""The suites' shared fixtures, for tests/ and e2e/ alike (a plugin, so that both folders have the
same ones without a copy): tests/support/fixtures.py."""

pytest_plugins = ["tests.support.fixtures"]
