"""Tests of kasd: config, agent tunnels, the Kubernetes API proxy (with a fake agent), observability."""
