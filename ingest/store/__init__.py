"""MongoDB: the writers of both layouts, schema, sharding, error classes."""
