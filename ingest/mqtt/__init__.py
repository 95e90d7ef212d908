"""The broker side: connect, subscribe, read, acknowledge."""
