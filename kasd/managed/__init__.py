"""Managed namespaces: what a job's verdict asks to exist (``kasd.authz.templates.ManagedResources``)
is created through the tunnel, as the agent, before the job's first request; and deleted when the
environment stops. The pipeline and the REST API's stop call know it only as the
``kasd.seams.Provisioner`` seam; ``kasd.server`` wires this implementation in.

- ``objects``: whose objects are whose and what to write — pure functions over Kubernetes objects
  and the plan (no I/O, no clock), so every decision is tested without a kasd;
- ``client``: ``AgentClient``, one JSON request to an agent's Kubernetes API (``kasd.agentclient``) through the
  ``Router``, with the pipeline's stream lifecycle (``kasd.agentstream``);
- ``provisioner``: ``AgentProvisioner``, which applies a plan (once at a time per replica) and
  stops one, asking ``objects`` what each answer means, within the deadlines its caller gives
  (``ProvisionLimits``).

May import: ``kasd.seams``, ``kasd.agentstream``, ``kasd.agentclient``, ``kasd.authz`` (pure values), ``kasd.store``
(what kasd made), ``tunnelhttp``, ``wire``, ``daemonkit.logs``, trio, attrs, the standard library.
Never the proxy, a front end or the REST API.
"""
