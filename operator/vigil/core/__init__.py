"""Every decision Vigil takes, as pure functions and values: given what was observed, the time
and the randomness (all passed in), what should happen. Nothing here does I/O, reads a clock or
keeps a connection; the shells in `vigil.controllers`, `vigil.leaderelection`, `vigil.servers`
and `vigil.agent` carry the decisions out.

The rule, enforced by tests/unit/core/test_import_rule.py: `vigil.core` imports only the standard
library, pydantic and `vigil.api`.
"""
