"""Helpers shared by the test suites: paths, fixtures ' processes, network namespaces."""
