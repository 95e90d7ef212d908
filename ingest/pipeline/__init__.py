"""Decode, batch, write, acknowledge: the daemon's stages and lifecycle."""
