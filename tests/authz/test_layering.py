"""The authorization package stays pure while it makes the seam's values: the verdict an Authority
answers with is defined here (``kasd.authz.verdict``) and re-exported by ``kasd.seams``, never the
reverse, so loading the decision pulls in no trio, no routing and not the seams."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_decision_loads_without_trio_routing_or_the_seams() -> None:
    code = ("import sys, kasd.authz.snapshot, kasd.authz.jobinfo, kasd.authz.verdict; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'routing') "
            "or m in ('kasd.seams', 'kasd.config', 'kasd.store')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_the_seam_answers_with_the_values_authorization_makes() -> None:
    import kasd.authz.verdict
    import kasd.seams

    assert kasd.seams.Grant is kasd.authz.verdict.Grant
    assert kasd.seams.AccessDenied is kasd.authz.verdict.AccessDenied
