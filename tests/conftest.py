"""Shared pytest configuration: tests import the checkout they run in."""
