"""Request processors by request family (RocketMQ's broker/processor): send, pull, query, reply,
send-back, end-transaction and resume-half in the net actors; admin, client, offset, progress, cleanup
and ACL in the broker actor. Also what a pull filters by (message_filter) and the send path's per-connection
turn-taking (turns)."""
