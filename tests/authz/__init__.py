"""Tests of kasd.authz: signed tokens and their keys."""
