"""Transactional messages (RocketMQ's transaction/): the check-back of open halves, run in the broker actor.
END_TRANSACTION and RESUME_CHECK_HALF_MESSAGE are served in smartgo.broker.processor."""
