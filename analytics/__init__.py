"""SmartGo analytics on Spark: the traffic report over the brokers' stats files, and the store's
CommitLog as a DataFrame (the "smartgo" data source) with ad-hoc SQL. See docs/ANALYTICS.md."""
