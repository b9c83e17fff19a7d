"""Tests of kasd.authz: tokens and keys, the rules language, namespace templates, slugs, CI variables, rule lists, the access model."""
