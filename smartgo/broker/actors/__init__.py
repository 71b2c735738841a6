"""The broker's actor processes, one module each (RocketMQ's BrokerController services as processes):
broker (control plane), net (connections and the wire), commit, flush, dispatch, hold (long polling),
schedule (delayed delivery), cleanup (retention) and ha (replication). The roles table names them by
dotted path (smartgo.node.roles)."""
