"""Replication and failover (RocketMQ's ha/ and slave/): the master's HA service and the slave's HA client,
a lagging slave's reseed, automatic failover's role file and its broker-actor side, a slave's metadata sync
and its forwarding of writes to the master."""
