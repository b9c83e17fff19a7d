"""Tests of kasctl commands that run without a stack: keys and tokens."""
