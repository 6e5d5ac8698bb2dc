"""Conformance suites: one per interface, parametrised over every backend."""
