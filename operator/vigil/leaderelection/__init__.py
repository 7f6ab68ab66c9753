"""Leader election on a Lease: the elector's loop (`elector`) around `vigil.core.election`, and the
leader's mark on its own pod for the webhook's Service (`mark`)."""
