"""Tests of kasd.authz: the rules language, namespace templates, slugs, CI variables, rule lists."""
