"""Breakwater's infrastructure: the stack composes, one construct per concern builds."""
