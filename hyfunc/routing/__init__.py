"""Learning from traffic (ODIA): what was served, which requests are simple, where to route them."""
