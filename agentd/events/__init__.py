"""Events kasd pushes to agentd (streams of kind ``event``) and what agentd does with them.

Modules: ``settings`` (the ``events:`` section of agentd's configuration), ``model`` (the stream's
OPEN metadata, payload and ACCEPT outcome, sans-I/O), ``exchange`` (one small HTTP exchange through
``agentd.upstream``), ``webhook`` (the signed POST), ``annotate`` (the merge patch Flux reacts to),
``handler`` (``EventHandler``: the stream handler, the ordered worker, dedup and retries).

May import: ``agentd.upstream``, ``agentd.kubeapi``, ``tunnelhttp``, ``wire``, ``daemonkit``, the
standard library, trio, attrs.
"""

from __future__ import annotations

from agentd.events.handler import EventHandler, EventRecord
from agentd.events.settings import EventsSettings, parse_events

__all__ = ["EventHandler", "EventRecord", "EventsSettings", "parse_events"]
