"""Statistics and metrics (RocketMQ's BrokerStatsManager and its exporter): counters from the net actors,
the 4.x stats items for VIEW_BROKER_STATS_DATA, the hourly stats files, and the Prometheus endpoint."""
