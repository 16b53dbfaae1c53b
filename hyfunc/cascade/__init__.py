"""The HyFunc cascade: soft token (large model), retriever, and the small model's dynamic templating decoder."""
