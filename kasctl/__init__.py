"""kasctl: the command-line companion of kasd — for now, the all-in-one demo stack.

``kasctl.stack`` starts kubesim, kasd and agentd as real processes on loopback with throwaway
tokens and certificates (the demo and the end-to-end tests share it); ``kasctl.__main__`` is the CLI.
May import: stdlib, yaml, trustme (the ``demo`` extra, imported only when a stack is made); it
talks to the daemons, and to kubesim (a distribution of its own), only through their command lines.
"""
