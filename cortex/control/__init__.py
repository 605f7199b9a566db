"""The control plane: an ASGI app under hypercorn (trio worker) on its own port."""
