"""The standard rules in Python: the same decisions as the Rust `standard` policy, through
the Python SDK (guest/python). Built by `tollgate policy build policies/python/standard`."""

import tollgate_policy


class Decide(tollgate_policy.Policy):
    NAME = "standard"
    VERSION = "0.2.0-python"
